//! Stream commands (Redis 7.0's `t_stream.c` semantics and texts). A stream
//! is an ordered counted tree of entries keyed by ID, and each consumer
//! group a tree of its pending entries, all pieces under one collection id,
//! with the rest of the stream's state in its head
//! (`engine::types::stream`). XADD, XDEL, XACK and finding where a range
//! starts cost O(log n) pieces; a range of m entries O(log n + m). Every
//! command runs under its keys' stripe locks and is one batch (crash-atomic
//! with the durable engines), readers included (`crate::coll`).
//!
//! Differences from Redis: `~` trimming trims exactly to the threshold
//! (within LIMIT), which the documentation allows; XINFO STREAM's
//! `radix-tree-keys` and `radix-tree-nodes` are estimates from the length
//! (Redis's radix tree does not exist here); reading a consumer's history
//! (XREADGROUP with an ID) and XPENDING for one consumer walk the group's
//! pending entries from the start ID, where Redis keeps one list per
//! consumer.

use super::{eq, int_arg, locked, CmdError, Ctx, R};
use crate::blocking::{self, Try, Wait};
use crate::coll::{self, KsPieces};
use crate::keyspace::{skey, KIND_STREAM};
use crate::notify::{self, event};
use crate::server::Client;
use engine::types::node::Entry;
use engine::types::stream::{
    decode_entry, entry_member, Consumer, Group, Pending, Sid, StreamHead,
};
use engine::types::tree::{self, Pieces, Tree};
use proto::{Reply, Version};

/// Redis's `XREAD_BLOCKED_DEFAULT_COUNT`: a blocked read without COUNT.
const BLOCKED_DEFAULT_COUNT: usize = 1000;
/// Redis's default `stream-node-max-entries` times 100: the default LIMIT of
/// an approximate trim.
const APPROX_LIMIT: u64 = 10_000;

/// A stream read under its stripe lock.
struct Stream {
    expire: Option<i64>,
    head: StreamHead,
}

fn load(ctx: &mut Ctx, sk: &[u8]) -> Result<Option<Stream>, CmdError> {
    Ok(super::load_head(ctx, sk, KIND_STREAM, StreamHead::decode)?
        .map(|(expire, head)| Stream { expire, head }))
}

/// Stages the stream's new head (an empty stream stays, as in Redis).
fn save(ctx: &mut Ctx, sk: &[u8], s: &Stream) {
    super::save_head(ctx, sk, KIND_STREAM, s.expire, false, |out| {
        s.head.encode(out)
    });
}

/// A new empty stream (its collection id drawn now).
fn new_stream(ctx: &mut Ctx) -> Stream {
    coll::mark_pieced(ctx.sh, ctx.ks);
    Stream {
        expire: None,
        head: StreamHead::new(coll::new_id()),
    }
}

/// Runs `f` on a tree of stream `id` (its entries, or a group's PEL).
fn with_tree<T>(
    ctx: &mut Ctx,
    id: u64,
    meta: &mut tree::Meta,
    f: impl FnOnce(&mut Tree<KsPieces>) -> engine::Result<T>,
) -> Result<T, CmdError> {
    let mut p = KsPieces::new(ctx.ks, id);
    let mut t = Tree::new(&mut p, meta, true).with_low_prefix(16);
    Ok(f(&mut t)?)
}

/// The ID prefix of a member (or of an inner node's low key).
fn id_bytes(e: &Entry) -> &[u8] {
    e.bytes.get(..16).unwrap_or(&e.bytes)
}

/// The position of the first element whose ID is at or above `id`.
fn seek(t: &mut Tree<KsPieces>, id: Sid) -> engine::Result<u64> {
    let k = id.be();
    t.count_before(|e| id_bytes(e) < &k[..])
}

/// The element with ID `id` and its position, if present.
fn find(t: &mut Tree<KsPieces>, id: Sid) -> engine::Result<Option<(u64, Entry)>> {
    let pos = seek(t, id)?;
    if pos >= t.meta.count {
        return Ok(None);
    }
    let e = t.get_at(pos)?;
    Ok((id_bytes(&e) == &id.be()[..]).then_some((pos, e)))
}

// ---- IDs ----

fn invalid_id() -> CmdError {
    CmdError::Msg("Invalid stream ID specified as stream command argument")
}

/// Redis's `streamGenericParseIDOrReply`: `ms-seq`, `ms` (the sequence
/// `missing_seq`), `-` and `+` unless `strict`; with `seq_given`, `ms-*`
/// (the sequence to be generated: `.1` false).
fn parse_id(a: &[u8], missing_seq: u64, strict: bool, star: bool) -> Result<(Sid, bool), CmdError> {
    if a.len() > 127 {
        return Err(invalid_id());
    }
    if a == b"-" || a == b"+" {
        if strict {
            return Err(invalid_id());
        }
        return Ok((if a == b"-" { Sid::MIN } else { Sid::MAX }, true));
    }
    let num = |b: &[u8]| string2ull(b).ok_or_else(invalid_id);
    match a.iter().position(|&b| b == b'-') {
        None => Ok((Sid::new(num(a)?, missing_seq), true)),
        Some(i) => {
            let ms = num(&a[..i])?;
            let rest = &a[i + 1..];
            if star && rest == b"*" {
                Ok((Sid::new(ms, 0), false))
            } else {
                Ok((Sid::new(ms, num(rest)?), true))
            }
        }
    }
}

/// Redis's `string2ull`: a strict decimal (no sign, no leading zero)
/// that is not negative, else whatever C's `strtoull` takes whole (leading
/// white space, a sign, leading zeros; a minus negates modulo 2^64).
fn string2ull(b: &[u8]) -> Option<u64> {
    if let Some(v) = proto::int::parse_i64(b) {
        return (v >= 0).then_some(v as u64);
    }
    let mut i = 0;
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c) {
        i += 1;
    }
    let neg = match b.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    if i >= b.len() {
        return None;
    }
    let mut v: u64 = 0;
    for &d in &b[i..] {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(if neg { v.wrapping_neg() } else { v })
}

fn strict_id(a: &[u8]) -> Result<Sid, CmdError> {
    Ok(parse_id(a, 0, true, false)?.0)
}

/// A range bound (`streamParseIntervalIDOrReply`): `(` makes it exclusive,
/// which moves it one ID inwards.
fn interval(a: &[u8], missing_seq: u64, start: bool) -> Result<Sid, CmdError> {
    if a.len() > 1 && a[0] == b'(' {
        let id = parse_id(&a[1..], missing_seq, true, false)?.0;
        let moved = if start { id.next() } else { id.prev() };
        moved.ok_or(CmdError::Msg(if start {
            "invalid start ID for the interval"
        } else {
            "invalid end ID for the interval"
        }))
    } else {
        Ok(parse_id(a, missing_seq, false, false)?.0)
    }
}

fn id_reply(id: Sid) -> Reply {
    Reply::Bulk(id.to_string().into_bytes())
}

/// An entry as Redis replies it: [id, [field, value, ...]].
fn entry_reply(member: &[u8]) -> Result<Reply, CmdError> {
    let (id, pairs) = decode_entry(member)?;
    let mut flat = Vec::with_capacity(pairs.len() * 2);
    for (f, v) in pairs {
        flat.push(Reply::Bulk(f));
        flat.push(Reply::Bulk(v));
    }
    Ok(Reply::Array(vec![id_reply(id), Reply::Array(flat)]))
}

/// The members of the entries with IDs in `start..=end`, at most `count`
/// (0: all), from the end when `rev`.
fn range(
    ctx: &mut Ctx,
    h: &mut StreamHead,
    start: Sid,
    end: Sid,
    count: usize,
    rev: bool,
) -> Result<Vec<Vec<u8>>, CmdError> {
    if start > end {
        return Ok(Vec::new());
    }
    let id = h.id;
    with_tree(ctx, id, &mut h.entries, |t| {
        let lo = seek(t, start)?;
        let hi = match end.next() {
            Some(n) => seek(t, n)?,
            None => t.meta.count,
        };
        let mut out = Vec::new();
        if lo < hi {
            t.for_range(lo, hi - 1, rev, |e| {
                out.push(e.bytes.clone());
                count == 0 || out.len() < count
            })?;
        }
        Ok(out)
    })
}

/// The ID of the stream's last entry (Redis's `streamLastValidID`: not
/// the last generated ID, which may be past it), None when it is empty.
fn last_entry(ctx: &mut Ctx, h: &mut StreamHead) -> Result<Option<Sid>, CmdError> {
    if h.entries.count == 0 {
        return Ok(None);
    }
    let id = h.id;
    let e = with_tree(ctx, id, &mut h.entries, |t| {
        let n = t.meta.count;
        t.get_at(n - 1)
    })?;
    Ok(Some(Sid::from_be(&e.bytes)?))
}

fn first_id(ctx: &mut Ctx, h: &mut StreamHead) -> Result<Sid, CmdError> {
    if h.entries.count == 0 {
        return Ok(Sid::MIN);
    }
    let id = h.id;
    let e = with_tree(ctx, id, &mut h.entries, |t| t.get_at(0))?;
    Ok(Sid::from_be(&e.bytes)?)
}

/// Redis's `streamRangeHasTombstones(s, start, NULL)`.
fn tombstones_after(h: &StreamHead, first: Sid, start: Sid) -> bool {
    if h.entries.count == 0 || h.max_deleted == Sid::MIN || first > h.max_deleted {
        return false;
    }
    start <= h.max_deleted
}

/// Redis's `streamEstimateDistanceFromFirstEverEntry`: -1 when unknown.
fn estimate_read(h: &StreamHead, first: Sid, id: Sid) -> i64 {
    if h.entries_added == 0 {
        return 0;
    }
    let len = h.entries.count;
    if len == 0 && id <= h.last {
        return h.entries_added as i64;
    }
    if id == h.last {
        return h.entries_added as i64;
    }
    if id > h.last {
        return -1;
    }
    if h.max_deleted == Sid::MIN || h.max_deleted < first {
        if id < first {
            return (h.entries_added - len) as i64;
        } else if id == first {
            return (h.entries_added - len + 1) as i64;
        }
    }
    -1
}

/// A group's lag (XINFO), None when it cannot be known.
fn lag(h: &StreamHead, first: Sid, g: &Group) -> Option<i64> {
    if h.entries_added == 0 {
        return Some(0);
    }
    if g.entries_read != -1 && !tombstones_after(h, first, g.last) {
        return Some(h.entries_added as i64 - g.entries_read);
    }
    let er = estimate_read(h, first, g.last);
    (er != -1).then(|| h.entries_added as i64 - er)
}

fn opt_int(v: Option<i64>) -> Reply {
    v.map_or(Reply::Null, Reply::Integer)
}

// ---- XADD, XTRIM ----

#[derive(Default)]
struct TrimArgs {
    maxlen: Option<u64>,
    minid: Option<Sid>,
    approx: bool,
    limit: u64,
    nomkstream: bool,
    /// XADD's ID: None for `*`; (id, sequence given).
    id: Option<(Sid, bool)>,
}

/// `streamParseAddOrTrimArgsOrReply`: the options, and for XADD the index
/// of its ID argument.
fn parse_trim(a: &[Vec<u8>], xadd: bool) -> Result<(TrimArgs, usize), CmdError> {
    let mut t = TrimArgs::default();
    let mut limit_given = false;
    let mut i = 2;
    while i < a.len() {
        let more = a.len() - 1 - i;
        let o = &a[i];
        if xadd && o.as_slice() == b"*" {
            break;
        } else if (eq(o, "maxlen") || eq(o, "minid")) && more > 0 {
            if t.maxlen.is_some() || t.minid.is_some() {
                return Err(CmdError::Msg(
                    "syntax error, MAXLEN and MINID options at the same time are not compatible",
                ));
            }
            t.approx = false;
            let next = &a[i + 1];
            if more >= 2 && next.as_slice() == b"~" {
                t.approx = true;
                i += 1;
            } else if more >= 2 && next.as_slice() == b"=" {
                i += 1;
            }
            if eq(o, "maxlen") {
                let n = int_arg(&a[i + 1])?;
                if n < 0 {
                    return Err(CmdError::Msg("The MAXLEN argument must be >= 0."));
                }
                t.maxlen = Some(n as u64);
            } else {
                t.minid = Some(strict_id(&a[i + 1])?);
            }
            i += 2;
        } else if eq(o, "limit") && more > 0 {
            let n = int_arg(&a[i + 1])?;
            if n < 0 {
                return Err(CmdError::Msg("The LIMIT argument must be >= 0."));
            }
            t.limit = n as u64;
            limit_given = true;
            i += 2;
        } else if xadd && eq(o, "nomkstream") {
            t.nomkstream = true;
            i += 1;
        } else if xadd {
            t.id = Some(parse_id(o, 0, true, true)?);
            break;
        } else {
            return Err(CmdError::Syntax);
        }
    }
    let strategy = t.maxlen.is_some() || t.minid.is_some();
    if t.limit > 0 && !strategy {
        return Err(CmdError::Msg(
            "syntax error, LIMIT cannot be used without specifying a trimming strategy",
        ));
    }
    if !xadd && !strategy {
        return Err(CmdError::Msg(
            "syntax error, XTRIM must be called with a trimming strategy",
        ));
    }
    if limit_given {
        if !t.approx {
            return Err(CmdError::Msg(
                "syntax error, LIMIT cannot be used without the special ~ option",
            ));
        }
    } else if t.approx {
        t.limit = APPROX_LIMIT;
    }
    Ok((t, i))
}

/// Trims per `t` (exact; `~` within LIMIT, 0 = none): the entries removed.
fn trim(ctx: &mut Ctx, h: &mut StreamHead, t: &TrimArgs) -> Result<u64, CmdError> {
    let id = h.id;
    let mut n = with_tree(ctx, id, &mut h.entries, |tr| {
        let len = tr.meta.count;
        Ok(if let Some(max) = t.maxlen {
            len.saturating_sub(max)
        } else if let Some(min) = t.minid {
            seek(tr, min)?
        } else {
            0
        })
    })?;
    if t.approx && t.limit > 0 {
        n = n.min(t.limit);
    }
    with_tree(ctx, id, &mut h.entries, |tr| {
        for _ in 0..n {
            tr.remove_rank(0)?;
        }
        Ok(())
    })?;
    Ok(n)
}

pub fn xadd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (t, idpos) = parse_trim(a, true)?;
    let fields = idpos + 1;
    if a.len() < fields + 2 || (a.len() - fields) % 2 == 1 {
        return Err(super::arity_error("xadd"));
    }
    if let Some((id, true)) = t.id {
        if id == Sid::MIN {
            return Err(CmdError::Msg(
                "The ID specified in XADD must be greater than 0-0",
            ));
        }
    }
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let mut s = match load(ctx, &sk)? {
            Some(s) => s,
            None if t.nomkstream => {
                c.null();
                return Ok(());
            }
            None => new_stream(ctx),
        };
        let h = &mut s.head;
        if h.last == Sid::MAX {
            return Err(CmdError::Msg(
                "The stream has exhausted the last possible ID, unable to add more items",
            ));
        }
        let too_small = CmdError::Msg(
            "The ID specified in XADD is equal or smaller than the target stream top item",
        );
        let id = match t.id {
            Some((id, true)) => id,
            Some((id, false)) if id.ms == h.last.ms => h.last.next().ok_or(too_small)?,
            Some((id, false)) => id,
            None => {
                let now = ctx.now.max(0) as u64;
                if now > h.last.ms {
                    Sid::new(now, 0)
                } else {
                    h.last.next().ok_or(too_small)?
                }
            }
        };
        if id <= h.last {
            return Err(CmdError::Msg(
                "The ID specified in XADD is equal or smaller than the target stream top item",
            ));
        }
        let pairs: Vec<(&[u8], &[u8])> = a[fields..]
            .chunks(2)
            .map(|p| (p[0].as_slice(), p[1].as_slice()))
            .collect();
        let member = entry_member(id, &pairs);
        let cid = h.id;
        with_tree(ctx, cid, &mut h.entries, |tr| tr.insert_key(0.0, &member))?;
        h.last = id;
        h.entries_added += 1;
        event(ctx, notify::STREAM, "xadd", c.db, &a[1]);
        if (t.maxlen.is_some() || t.minid.is_some()) && trim(ctx, h, &t)? > 0 {
            event(ctx, notify::STREAM, "xtrim", c.db, &a[1]);
        }
        save(ctx, &sk, &s);
        c.bulk(id.to_string().as_bytes());
        Ok(())
    })
}

pub fn xtrim(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (t, _) = parse_trim(a, false)?;
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let Some(mut s) = load(ctx, &sk)? else {
            c.int(0);
            return Ok(());
        };
        let n = trim(ctx, &mut s.head, &t)?;
        if n > 0 {
            save(ctx, &sk, &s);
            event(ctx, notify::STREAM, "xtrim", c.db, &a[1]);
        }
        c.int(n as i64);
        Ok(())
    })
}

pub fn xdel(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let Some(mut s) = load(ctx, &sk)? else {
            c.int(0);
            return Ok(());
        };
        let ids = a[2..]
            .iter()
            .map(|x| strict_id(x))
            .collect::<Result<Vec<_>, _>>()?;
        let h = &mut s.head;
        let cid = h.id;
        let mut deleted = 0;
        for id in ids {
            let gone = with_tree(ctx, cid, &mut h.entries, |t| match find(t, id)? {
                Some((pos, _)) => t.remove_rank(pos).map(|_| true),
                None => Ok(false),
            })?;
            if gone {
                deleted += 1;
                if id > h.max_deleted {
                    h.max_deleted = id;
                }
            }
        }
        if deleted > 0 {
            save(ctx, &sk, &s);
            event(ctx, notify::STREAM, "xdel", c.db, &a[1]);
        }
        c.int(deleted);
        Ok(())
    })
}

pub fn xlen(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let n = load(ctx, &sk)?.map_or(0, |s| s.head.entries.count);
        c.int(n as i64);
        Ok(())
    })
}

fn xrange_generic(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], rev: bool) -> R {
    let (sa, ea) = if rev { (&a[3], &a[2]) } else { (&a[2], &a[3]) };
    let start = interval(sa, 0, true)?;
    let end = interval(ea, u64::MAX, false)?;
    let mut count: i64 = -1;
    let mut j = 4;
    while j < a.len() {
        if eq(&a[j], "count") && j + 1 < a.len() {
            count = int_arg(&a[j + 1])?.max(0);
            j += 2;
        } else {
            return Err(CmdError::Syntax);
        }
    }
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let Some(mut s) = load(ctx, &sk)? else {
            c.reply(&Reply::Array(Vec::new()));
            return Ok(());
        };
        if count == 0 {
            c.reply(&Reply::NullArray);
            return Ok(());
        }
        let n = if count < 0 { 0 } else { count as usize };
        let members = range(ctx, &mut s.head, start, end, n, rev)?;
        let items = members
            .iter()
            .map(|m| entry_reply(m))
            .collect::<Result<Vec<_>, _>>()?;
        c.reply(&Reply::Array(items));
        Ok(())
    })
}

pub fn xrange(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    xrange_generic(ctx, c, a, false)
}

pub fn xrevrange(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    xrange_generic(ctx, c, a, true)
}

// ---- groups: the shared steps ----

fn nogroup(key: &[u8], group: &[u8], tail: &str) -> CmdError {
    CmdError::Text(format!(
        "NOGROUP No such key '{}' or consumer group '{}'{tail}",
        String::from_utf8_lossy(key),
        String::from_utf8_lossy(group)
    ))
}

/// The consumer's index in group `g`, created (seen now) when absent; a
/// found one is seen now too (Redis's lookup refreshes it).
fn consumer_of(g: &mut Group, name: &[u8], now: i64) -> (usize, bool) {
    match g.consumer(name) {
        Ok(i) => {
            g.consumers[i].seen = now;
            (i, false)
        }
        Err(i) => {
            g.consumers.insert(
                i,
                Consumer {
                    name: name.to_vec(),
                    seen: now,
                    pending: 0,
                },
            );
            (i, true)
        }
    }
}

/// [`consumer_of`], publishing Redis's `xgroup-createconsumer` event on
/// `key` (database `db`) when it creates the consumer.
fn consumer_seen(ctx: &mut Ctx, h: &mut StreamHead, gi: usize, name: &[u8], key: (u8, &[u8])) {
    let now = ctx.now;
    if consumer_of(&mut h.groups[gi], name, now).1 {
        event(ctx, notify::STREAM, "xgroup-createconsumer", key.0, key.1);
    }
}

/// Takes one pending entry away from consumer `name`'s count.
fn unpend(g: &mut Group, name: &[u8]) {
    if let Ok(i) = g.consumer(name) {
        let c = &mut g.consumers[i];
        c.pending = c.pending.saturating_sub(1);
    }
}

/// Puts `p` in group `gi`'s PEL in place of the entry there with its ID (a
/// new owner, time or count), keeping the consumers' counts.
fn pel_put(ctx: &mut Ctx, h: &mut StreamHead, gi: usize, p: &Pending) -> Result<(), CmdError> {
    let cid = h.id;
    let g = &mut h.groups[gi];
    let old = with_tree(ctx, cid, &mut g.pel, |t| match find(t, p.id)? {
        Some((pos, e)) => {
            t.remove_rank(pos)?;
            Ok(Some(e))
        }
        None => Ok(None),
    })?;
    if let Some(e) = old {
        let was = Pending::decode(&e.bytes)?;
        unpend(g, &was.consumer);
    }
    let m = p.member();
    with_tree(ctx, cid, &mut g.pel, |t| t.insert_key(0.0, &m))?;
    if let Ok(i) = g.consumer(&p.consumer) {
        g.consumers[i].pending += 1;
    }
    Ok(())
}

/// Removes the pending entry at `pos` of group `gi`'s PEL.
fn pel_remove_at(ctx: &mut Ctx, h: &mut StreamHead, gi: usize, pos: u64) -> Result<(), CmdError> {
    let cid = h.id;
    let g = &mut h.groups[gi];
    let e = with_tree(ctx, cid, &mut g.pel, |t| t.remove_rank(pos))?;
    let p = Pending::decode(&e.bytes)?;
    unpend(g, &p.consumer);
    Ok(())
}

/// The pending entry with ID `id` of group `gi`, with its position.
fn pel_find(
    ctx: &mut Ctx,
    h: &mut StreamHead,
    gi: usize,
    id: Sid,
) -> Result<Option<(u64, Pending)>, CmdError> {
    let cid = h.id;
    let g = &mut h.groups[gi];
    match with_tree(ctx, cid, &mut g.pel, |t| find(t, id))? {
        Some((pos, e)) => Ok(Some((pos, Pending::decode(&e.bytes)?))),
        None => Ok(None),
    }
}

/// The pending entry at `pos` of group `gi` (None past the end).
fn pel_at(
    ctx: &mut Ctx,
    h: &mut StreamHead,
    gi: usize,
    pos: u64,
) -> Result<Option<Pending>, CmdError> {
    let cid = h.id;
    let g = &mut h.groups[gi];
    if pos >= g.pel.count {
        return Ok(None);
    }
    let e = with_tree(ctx, cid, &mut g.pel, |t| t.get_at(pos))?;
    Ok(Some(Pending::decode(&e.bytes)?))
}

fn pel_seek(ctx: &mut Ctx, h: &mut StreamHead, gi: usize, id: Sid) -> Result<u64, CmdError> {
    let cid = h.id;
    let g = &mut h.groups[gi];
    with_tree(ctx, cid, &mut g.pel, |t| seek(t, id))
}

/// The entry with ID `id`, if the stream holds it.
fn entry(ctx: &mut Ctx, h: &mut StreamHead, id: Sid) -> Result<Option<Vec<u8>>, CmdError> {
    let cid = h.id;
    Ok(with_tree(ctx, cid, &mut h.entries, |t| find(t, id))?.map(|(_, e)| e.bytes))
}

/// Delivers to consumer `cons` of group `gi` the entries after the group's
/// last delivered ID (at most `count`, 0: all): Redis's
/// `streamReplyWithRange` with a group: the group's last ID and read
/// counter move, and each entry becomes pending for the consumer unless
/// `noack`. The entries' replies.
fn deliver(
    ctx: &mut Ctx,
    h: &mut StreamHead,
    gi: usize,
    cons: &[u8],
    count: usize,
    noack: bool,
    key: (u8, &[u8]),
) -> Result<Vec<Reply>, CmdError> {
    let now = ctx.now;
    consumer_seen(ctx, h, gi, cons, key);
    let Some(start) = h.groups[gi].last.next() else {
        return Ok(Vec::new());
    };
    let members = range(ctx, h, start, Sid::MAX, count, false)?;
    let first = first_id(ctx, h)?;
    let mut out = Vec::with_capacity(members.len());
    for m in members {
        let id = Sid::from_be(&m)?;
        let tomb = tombstones_after(h, first, id);
        let est = estimate_read(h, first, id);
        let added = h.entries_added;
        let g = &mut h.groups[gi];
        if id > g.last {
            if g.entries_read != -1 && !tomb {
                g.entries_read += 1;
            } else if added > 0 {
                g.entries_read = est;
            }
            g.last = id;
        }
        if !noack {
            pel_put(
                ctx,
                h,
                gi,
                &Pending {
                    id,
                    delivered: now,
                    count: 1,
                    consumer: cons.to_vec(),
                },
            )?;
        }
        out.push(entry_reply(&m)?);
    }
    Ok(out)
}

/// A consumer's history (XREADGROUP with an ID): its pending entries from
/// `start` on (at most `count`, 0: all), each delivered again (time now,
/// count + 1); an entry deleted from the stream since is [id, nil].
fn history(
    ctx: &mut Ctx,
    h: &mut StreamHead,
    gi: usize,
    cons: &[u8],
    start: Sid,
    count: usize,
    key: (u8, &[u8]),
) -> Result<Vec<Reply>, CmdError> {
    let now = ctx.now;
    consumer_seen(ctx, h, gi, cons, key);
    let mut out = Vec::new();
    let mut pos = pel_seek(ctx, h, gi, start)?;
    while count == 0 || out.len() < count {
        let Some(mut p) = pel_at(ctx, h, gi, pos)? else {
            break;
        };
        pos += 1;
        if p.consumer != cons {
            continue;
        }
        match entry(ctx, h, p.id)? {
            Some(m) => {
                out.push(entry_reply(&m)?);
                p.delivered = now;
                p.count += 1;
                pel_put(ctx, h, gi, &p)?;
            }
            None => out.push(Reply::Array(vec![id_reply(p.id), Reply::NullArray])),
        }
    }
    Ok(out)
}

// ---- XREAD, XREADGROUP ----

struct ReadArgs {
    block: Option<u64>,
    count: usize,
    group: Option<(Vec<u8>, Vec<u8>)>,
    noack: bool,
    /// Index of the first key; as many IDs follow the keys.
    keys_at: usize,
    n: usize,
}

fn parse_read(a: &[Vec<u8>], group_cmd: bool) -> Result<ReadArgs, CmdError> {
    let mut r = ReadArgs {
        block: None,
        count: 0,
        group: None,
        noack: false,
        keys_at: 0,
        n: 0,
    };
    let mut i = 1;
    while i < a.len() {
        let more = a.len() - i - 1;
        let o = &a[i];
        if eq(o, "block") && more > 0 {
            let t = proto::int::parse_i64(&a[i + 1])
                .ok_or(CmdError::Msg("timeout is not an integer or out of range"))?;
            if t < 0 {
                return Err(CmdError::TimeoutNegative);
            }
            r.block = Some(t as u64);
            i += 2;
        } else if eq(o, "count") && more > 0 {
            r.count = int_arg(&a[i + 1])?.max(0) as usize;
            i += 2;
        } else if eq(o, "streams") && more > 0 {
            let rest = a.len() - i - 1;
            if !rest.is_multiple_of(2) {
                return Err(CmdError::Msg(
                    "Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.",
                ));
            }
            r.keys_at = i + 1;
            r.n = rest / 2;
            break;
        } else if eq(o, "group") && more >= 2 {
            if !group_cmd {
                return Err(CmdError::Msg(
                    "The GROUP option is only supported by XREADGROUP. You called XREAD instead.",
                ));
            }
            r.group = Some((a[i + 1].clone(), a[i + 2].clone()));
            i += 3;
        } else if eq(o, "noack") {
            if !group_cmd {
                return Err(CmdError::Msg(
                    "The NOACK option is only supported by XREADGROUP. You called XREAD instead.",
                ));
            }
            r.noack = true;
            i += 1;
        } else {
            return Err(CmdError::Syntax);
        }
    }
    if r.keys_at == 0 {
        return Err(CmdError::Syntax);
    }
    if group_cmd && r.group.is_none() {
        return Err(CmdError::Msg("Missing GROUP option for XREADGROUP"));
    }
    Ok(r)
}

/// What one stream of an XREAD(GROUP) asks for.
#[derive(Clone, Copy, PartialEq)]
enum After {
    /// Entries after this ID.
    Id(Sid),
    /// XREADGROUP's `>`: entries never delivered to the group.
    New,
}

/// The reply of an XREAD(GROUP) that served `served` (key, entries):
/// RESP2 an array of [key, entries], RESP3 a map.
fn read_reply(c: &mut Client, served: Vec<(Vec<u8>, Vec<Reply>)>) {
    if c.resp == Version::Resp3 {
        c.reply(&Reply::Map(
            served
                .into_iter()
                .map(|(k, e)| (Reply::Bulk(k), Reply::Array(e)))
                .collect(),
        ));
    } else {
        c.reply(&Reply::Array(
            served
                .into_iter()
                .map(|(k, e)| Reply::Array(vec![Reply::Bulk(k), Reply::Array(e)]))
                .collect(),
        ));
    }
}

fn xread_generic(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], group_cmd: bool) -> R {
    let r = parse_read(a, group_cmd)?;
    let keys: Vec<Vec<u8>> = (0..r.n).map(|i| skey(c.db, &a[r.keys_at + i])).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let mut resolved: Vec<After> = Vec::with_capacity(r.n);
    let served = locked(ctx, &refs, |ctx| {
        // The IDs, in order, with the keys' checks (WRONGTYPE, NOGROUP).
        let mut streams = Vec::with_capacity(r.n);
        for i in 0..r.n {
            let s = load(ctx, &keys[i])?;
            let key = &a[r.keys_at + i];
            let arg = &a[r.keys_at + r.n + i];
            let mut gi = None;
            if let Some((g, _)) = &r.group {
                match s.as_ref().map(|s| s.head.group(g)) {
                    Some(Ok(x)) => gi = Some(x),
                    _ => return Err(nogroup(key, g, " in XREADGROUP with GROUP option")),
                }
            }
            let after = if arg.as_slice() == b"$" {
                if group_cmd {
                    return Err(CmdError::Msg("The $ ID is meaningless in the context of XREADGROUP: you want to read the history of this consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID would just return an empty result set."));
                }
                After::Id(s.as_ref().map_or(Sid::MIN, |s| s.head.last))
            } else if arg.as_slice() == b">" {
                if !group_cmd {
                    return Err(CmdError::Msg("The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option."));
                }
                After::New
            } else {
                After::Id(strict_id(arg)?)
            };
            resolved.push(after);
            streams.push((s, gi));
        }
        let mut served = Vec::new();
        for (i, (found, gi)) in streams.into_iter().enumerate() {
            if found.is_none() {
                continue;
            }
            // Read again: a key named twice sees what serving it did.
            let Some(mut s) = load(ctx, &keys[i])? else {
                continue;
            };
            let key = a[r.keys_at + i].clone();
            let top = last_entry(ctx, &mut s.head)?;
            match (resolved[i], gi, &r.group) {
                (After::New, Some(gi), Some((_, cons))) if top > Some(s.head.groups[gi].last) => {
                    let e = deliver(ctx, &mut s.head, gi, cons, r.count, r.noack, (c.db, &key))?;
                    save(ctx, &keys[i], &s);
                    served.push((key, e));
                }
                (After::Id(id), Some(gi), Some((_, cons))) => {
                    let start = id.next().unwrap_or(Sid::MAX);
                    let e = history(ctx, &mut s.head, gi, cons, start, r.count, (c.db, &key))?;
                    save(ctx, &keys[i], &s);
                    served.push((key, e));
                }
                (After::Id(id), None, _) if top > Some(id) => {
                    let start = id.next().unwrap_or(Sid::MAX);
                    let members = range(ctx, &mut s.head, start, Sid::MAX, r.count, false)?;
                    let e = members
                        .iter()
                        .map(|m| entry_reply(m))
                        .collect::<Result<Vec<_>, _>>()?;
                    served.push((key, e));
                }
                _ => {}
            }
        }
        Ok(served)
    })?;
    if !served.is_empty() {
        read_reply(c, served);
        return Ok(());
    }
    let Some(timeout_ms) = r.block else {
        c.reply(&Reply::NullArray);
        return Ok(());
    };
    if c.deny_blocking {
        c.reply(&Reply::NullArray);
        return Ok(());
    }
    // Wait, with `$` replaced by the ID it stood for now.
    let mut args = a.to_vec();
    for (i, after) in resolved.iter().enumerate() {
        if let After::Id(id) = after {
            args[r.keys_at + r.n + i] = id.to_string().into_bytes();
        }
    }
    let w = Wait {
        keys: (r.keys_at..r.keys_at + r.n).collect(),
        also_lock: Vec::new(),
        timeout_ms,
        kind: KIND_STREAM,
        serve: if group_cmd {
            serve_xreadgroup
        } else {
            serve_xread
        },
    };
    blocking::wait(ctx, c, &args, w)
}

/// A blocked XREAD's try at the key at argument `i`.
fn serve_xread(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], i: usize) -> Result<Try, CmdError> {
    let r = parse_read(a, false)?;
    let sk = skey(c.db, &a[i]);
    let mut s = match load(ctx, &sk) {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(Try::Empty),
        Err(CmdError::WrongType) => return Ok(Try::Mismatch),
        Err(e) => return Err(e),
    };
    let id = strict_id(&a[i + r.n])?;
    if last_entry(ctx, &mut s.head)? <= Some(id) {
        return Ok(Try::Empty);
    }
    let count = if r.count == 0 {
        BLOCKED_DEFAULT_COUNT
    } else {
        r.count
    };
    let start = id.next().unwrap_or(Sid::MAX);
    let members = range(ctx, &mut s.head, start, Sid::MAX, count, false)?;
    let e = members
        .iter()
        .map(|m| entry_reply(m))
        .collect::<Result<Vec<_>, _>>()?;
    read_reply(c, vec![(a[i].clone(), e)]);
    Ok(Try::Served)
}

/// A blocked XREADGROUP's try at the key at argument `i`: new entries for
/// its group; a group destroyed meanwhile ends the wait with an error.
fn serve_xreadgroup(
    ctx: &mut Ctx,
    c: &mut Client,
    a: &[Vec<u8>],
    i: usize,
) -> Result<Try, CmdError> {
    let r = parse_read(a, true)?;
    let Some((g, cons)) = &r.group else {
        return Err(CmdError::Syntax);
    };
    let sk = skey(c.db, &a[i]);
    let mut s = match load(ctx, &sk) {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(Try::Empty),
        Err(CmdError::WrongType) => return Ok(Try::Mismatch),
        Err(e) => return Err(e),
    };
    let Ok(gi) = s.head.group(g) else {
        return Err(CmdError::Text(
            "NOGROUP the consumer group this client was blocked on no longer exists".into(),
        ));
    };
    if last_entry(ctx, &mut s.head)? <= Some(s.head.groups[gi].last) {
        return Ok(Try::Empty);
    }
    let count = if r.count == 0 {
        BLOCKED_DEFAULT_COUNT
    } else {
        r.count
    };
    let e = deliver(ctx, &mut s.head, gi, cons, count, r.noack, (c.db, &a[i]))?;
    save(ctx, &sk, &s);
    read_reply(c, vec![(a[i].clone(), e)]);
    Ok(Try::Served)
}

pub fn xread(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    xread_generic(ctx, c, a, false)
}

pub fn xreadgroup(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    xread_generic(ctx, c, a, true)
}

// ---- XGROUP, XSETID ----

/// A container's subcommand check, as Redis's dispatch makes it: an unknown
/// subcommand, then the subcommand's arity (`table`: name and arity).
fn sub_arity(cmd: &'static str, sub: &[u8], n: usize, table: &[(&str, i32)]) -> R {
    let Some((name, arity)) = table.iter().find(|(name, _)| eq(sub, name)) else {
        return Err(super::unknown_subcommand(
            if cmd == "xgroup" { "XGROUP" } else { "XINFO" },
            sub,
        ));
    };
    if !super::arity_ok(*arity, n) {
        return Err(super::arity_error(format!("{cmd}|{name}")));
    }
    Ok(())
}

pub fn xgroup(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sub = &a[1];
    sub_arity(
        "xgroup",
        sub,
        a.len(),
        &[
            ("create", -5),
            ("createconsumer", 5),
            ("delconsumer", 5),
            ("destroy", 4),
            ("help", 2),
            ("setid", -5),
        ],
    )?;
    if eq(sub, "help") && a.len() == 2 {
        super::help(
            c,
            &[
                "XGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "CREATE <key> <groupname> <id|$> [option]",
                "    Create a new consumer group. Options are:",
                "    * MKSTREAM",
                "      Create the empty stream if it does not exist.",
                "    * ENTRIESREAD entries_read",
                "      Set the group's entries_read counter (internal use).",
                "CREATECONSUMER <key> <groupname> <consumer>",
                "    Create a new consumer in the specified group.",
                "DELCONSUMER <key> <groupname> <consumer>",
                "    Remove the specified consumer.",
                "DESTROY <key> <groupname>",
                "    Remove the specified group.",
                "SETID <key> <groupname> <id|$> [ENTRIESREAD entries_read]",
                "    Set the current group ID and entries_read counter.",
                "HELP",
                "    Prints this help.",
            ],
        );
        return Ok(());
    }
    // Past `sub_arity`, every subcommand names its key and group (2, 3).
    let syntax = || CmdError::SubcommandArgs {
        cmd: "XGROUP",
        sub: sub.clone(),
    };
    let create = eq(sub, "create");
    let setid = eq(sub, "setid");
    let mut mkstream = false;
    let mut entries_read: i64 = -1;
    let mut i = 5;
    while i < a.len() {
        if create && eq(&a[i], "mkstream") {
            mkstream = true;
            i += 1;
        } else if (create || setid) && eq(&a[i], "entriesread") && i + 1 < a.len() {
            entries_read = int_arg(&a[i + 1])?;
            if entries_read < 0 && entries_read != -1 {
                return Err(CmdError::Msg(
                    "value for ENTRIESREAD must be positive or -1",
                ));
            }
            i += 2;
        } else {
            return Err(syntax());
        }
    }
    let key = &a[2];
    let gname = &a[3];
    let sk = skey(c.db, key);
    locked(ctx, &[&sk], |ctx| {
        let found = load(ctx, &sk)?;
        if found.is_none() && !mkstream {
            return Err(CmdError::Msg("The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the MKSTREAM option to create an empty stream automatically."));
        }
        let group_of = |s: &Option<Stream>| s.as_ref().and_then(|s| s.head.group(gname).ok());
        let needs_group = setid || eq(sub, "createconsumer") || eq(sub, "delconsumer");
        if found.is_some() && needs_group && group_of(&found).is_none() {
            return Err(CmdError::Text(format!(
                "NOGROUP No such consumer group '{}' for key name '{}'",
                String::from_utf8_lossy(gname),
                String::from_utf8_lossy(key)
            )));
        }
        let gi = group_of(&found);
        if create && (5..=8).contains(&a.len()) {
            let id = if a[4].as_slice() == b"$" {
                found.as_ref().map_or(Sid::MIN, |s| s.head.last)
            } else {
                strict_id(&a[4])?
            };
            let mut s = match found {
                Some(s) => s,
                None => new_stream(ctx),
            };
            match s.head.group(gname) {
                Ok(_) => {
                    // MKSTREAM made the stream before the group failed.
                    save(ctx, &sk, &s);
                    return Err(CmdError::Text(
                        "BUSYGROUP Consumer Group name already exists".into(),
                    ));
                }
                Err(at) => {
                    let slot = s.head.next_slot;
                    s.head.next_slot += 1;
                    s.head
                        .groups
                        .insert(at, Group::new(gname.clone(), id, entries_read, slot));
                }
            }
            save(ctx, &sk, &s);
            event(ctx, notify::STREAM, "xgroup-create", c.db, key);
            c.ok();
            return Ok(());
        }
        let (Some(mut s), Some(gi)) = (found, gi) else {
            if eq(sub, "destroy") && a.len() == 4 {
                c.int(0);
                return Ok(());
            }
            return Err(syntax());
        };
        if setid && (a.len() == 5 || a.len() == 7) {
            let id = if a[4].as_slice() == b"$" {
                s.head.last
            } else {
                parse_id(&a[4], 0, false, false)?.0
            };
            let g = &mut s.head.groups[gi];
            g.last = id;
            g.entries_read = entries_read;
            save(ctx, &sk, &s);
            event(ctx, notify::STREAM, "xgroup-setid", c.db, key);
            c.ok();
        } else if eq(sub, "destroy") && a.len() == 4 {
            let g = s.head.groups.remove(gi);
            let mut pel = g.pel;
            let cid = s.head.id;
            with_tree(ctx, cid, &mut pel, |t| {
                for p in t.pieces()? {
                    t.p.remove(p)?;
                }
                Ok(())
            })?;
            save(ctx, &sk, &s);
            event(ctx, notify::STREAM, "xgroup-destroy", c.db, key);
            c.int(1);
        } else if eq(sub, "createconsumer") && a.len() == 5 {
            let g = &mut s.head.groups[gi];
            match g.consumer(&a[4]) {
                Ok(_) => c.int(0),
                Err(at) => {
                    g.consumers.insert(
                        at,
                        Consumer {
                            name: a[4].clone(),
                            seen: ctx.now,
                            pending: 0,
                        },
                    );
                    save(ctx, &sk, &s);
                    event(ctx, notify::STREAM, "xgroup-createconsumer", c.db, key);
                    c.int(1);
                }
            }
        } else if eq(sub, "delconsumer") && a.len() == 5 {
            let Ok(ci) = s.head.groups[gi].consumer(&a[4]) else {
                c.int(0);
                return Ok(());
            };
            let pending = s.head.groups[gi].consumers[ci].pending;
            // Its pending entries leave the group's PEL.
            let mut pos = 0;
            while let Some(p) = pel_at(ctx, &mut s.head, gi, pos)? {
                if p.consumer == a[4] {
                    pel_remove_at(ctx, &mut s.head, gi, pos)?;
                } else {
                    pos += 1;
                }
            }
            s.head.groups[gi].consumers.remove(ci);
            save(ctx, &sk, &s);
            event(ctx, notify::STREAM, "xgroup-delconsumer", c.db, key);
            c.int(pending as i64);
        } else {
            return Err(syntax());
        }
        Ok(())
    })
}

pub fn xsetid(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let id = strict_id(&a[2])?;
    let mut added: i64 = -1;
    let mut maxdel = Sid::MIN;
    let mut i = 3;
    while i < a.len() {
        let more = a.len() - 1 - i;
        if eq(&a[i], "entriesadded") && more > 0 {
            added = int_arg(&a[i + 1])?;
            if added < 0 {
                return Err(CmdError::Msg("entries_added must be positive"));
            }
            i += 2;
        } else if eq(&a[i], "maxdeletedid") && more > 0 {
            maxdel = strict_id(&a[i + 1])?;
            if id < maxdel {
                return Err(CmdError::Msg(
                    "The ID specified in XSETID is smaller than the provided max_deleted_entry_id",
                ));
            }
            i += 2;
        } else {
            return Err(CmdError::Syntax);
        }
    }
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let Some(mut s) = load(ctx, &sk)? else {
            return Err(CmdError::NoSuchKey);
        };
        let top = last_entry(ctx, &mut s.head)?;
        let h = &mut s.head;
        if let Some(top) = top {
            if id < top {
                return Err(CmdError::Msg(
                    "The ID specified in XSETID is smaller than the target stream top item",
                ));
            }
            if added != -1 && h.entries.count > added as u64 {
                return Err(CmdError::Msg("The entries_added specified in XSETID is smaller than the target stream length"));
            }
        }
        h.last = id;
        if added != -1 {
            h.entries_added = added as u64;
        }
        if maxdel != Sid::MIN {
            h.max_deleted = maxdel;
        }
        save(ctx, &sk, &s);
        event(ctx, notify::STREAM, "xsetid", c.db, &a[1]);
        c.ok();
        Ok(())
    })
}

// ---- XACK, XPENDING, XCLAIM, XAUTOCLAIM ----

/// The stream at the command's key and its group `a[2]` (under the lock):
/// None when either is missing.
fn stream_group(ctx: &mut Ctx, sk: &[u8], g: &[u8]) -> Result<Option<(Stream, usize)>, CmdError> {
    let Some(s) = load(ctx, sk)? else {
        return Ok(None);
    };
    Ok(match s.head.group(g) {
        Ok(gi) => Some((s, gi)),
        Err(_) => None,
    })
}

pub fn xack(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let Some((mut s, gi)) = stream_group(ctx, &sk, &a[2])? else {
            c.int(0);
            return Ok(());
        };
        let ids = a[3..]
            .iter()
            .map(|x| strict_id(x))
            .collect::<Result<Vec<_>, _>>()?;
        let mut acked = 0;
        for id in ids {
            if let Some((pos, _)) = pel_find(ctx, &mut s.head, gi, id)? {
                pel_remove_at(ctx, &mut s.head, gi, pos)?;
                acked += 1;
            }
        }
        if acked > 0 {
            save(ctx, &sk, &s);
        }
        c.int(acked);
        Ok(())
    })
}

pub fn xpending(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let n = a.len();
    if n != 3 && !(6..=9).contains(&n) {
        return Err(CmdError::Syntax);
    }
    let mut minidle = 0i64;
    let mut range_args = None;
    if n >= 6 {
        let mut at = 3;
        if eq(&a[3], "idle") {
            minidle = int_arg(&a[4])?;
            if n < 8 {
                return Err(CmdError::Syntax);
            }
            at += 2;
        }
        let count = int_arg(&a[at + 2])?.max(0) as u64;
        let start = interval(&a[at], 0, true)?;
        let end = interval(&a[at + 1], u64::MAX, false)?;
        let consumer = a.get(at + 3).cloned();
        range_args = Some((start, end, count, consumer));
    }
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let Some((mut s, gi)) = stream_group(ctx, &sk, &a[2])? else {
            return Err(nogroup(&a[1], &a[2], ""));
        };
        let now = ctx.now;
        let Some((start, end, mut count, consumer)) = range_args else {
            let g = &s.head.groups[gi];
            let total = g.pel.count;
            if total == 0 {
                c.reply(&Reply::Array(vec![
                    Reply::Integer(0),
                    Reply::Null,
                    Reply::Null,
                    Reply::NullArray,
                ]));
                return Ok(());
            }
            let owners: Vec<Reply> = g
                .consumers
                .iter()
                .filter(|c| c.pending > 0)
                .map(|c| {
                    Reply::Array(vec![
                        Reply::Bulk(c.name.clone()),
                        Reply::Bulk(c.pending.to_string().into_bytes()),
                    ])
                })
                .collect();
            let lo = pel_at(ctx, &mut s.head, gi, 0)?
                .map(|p| p.id)
                .unwrap_or_default();
            let hi = pel_at(ctx, &mut s.head, gi, total - 1)?
                .map(|p| p.id)
                .unwrap_or_default();
            c.reply(&Reply::Array(vec![
                Reply::Integer(total as i64),
                id_reply(lo),
                id_reply(hi),
                Reply::Array(owners),
            ]));
            return Ok(());
        };
        if let Some(name) = &consumer {
            if s.head.groups[gi].consumer(name).is_err() {
                c.reply(&Reply::Array(Vec::new()));
                return Ok(());
            }
        }
        let mut out = Vec::new();
        let mut pos = pel_seek(ctx, &mut s.head, gi, start)?;
        while count > 0 {
            let Some(p) = pel_at(ctx, &mut s.head, gi, pos)? else {
                break;
            };
            pos += 1;
            if p.id > end {
                break;
            }
            if consumer.as_ref().is_some_and(|n| *n != p.consumer) {
                continue;
            }
            if minidle != 0 && now - p.delivered < minidle {
                continue;
            }
            count -= 1;
            out.push(Reply::Array(vec![
                id_reply(p.id),
                Reply::Bulk(p.consumer),
                Reply::Integer((now - p.delivered).max(0)),
                Reply::Integer(p.count as i64),
            ]));
        }
        c.reply(&Reply::Array(out));
        Ok(())
    })
}

pub fn xclaim(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let Some((mut s, gi)) = stream_group(ctx, &sk, &a[2])? else {
            return Err(nogroup(&a[1], &a[2], ""));
        };
        let bad = |what: &'static str| CmdError::Msg(what);
        let minidle = proto::int::parse_i64(&a[4])
            .ok_or(bad("Invalid min-idle-time argument for XCLAIM"))?
            .max(0);
        let mut ids = Vec::new();
        let mut j = 5;
        while j < a.len() {
            match parse_id(&a[j], 0, true, false) {
                Ok((id, _)) => ids.push(id),
                Err(_) => break,
            }
            j += 1;
        }
        let now = ctx.now;
        let (mut force, mut justid) = (false, false);
        let mut retry: i64 = -1;
        let mut when: i64 = -1;
        let mut last = Sid::MIN;
        while j < a.len() {
            let more = a.len() - 1 - j;
            let o = &a[j];
            if eq(o, "force") {
                force = true;
            } else if eq(o, "justid") {
                justid = true;
            } else if eq(o, "idle") && more > 0 {
                j += 1;
                let v = proto::int::parse_i64(&a[j])
                    .ok_or(bad("Invalid IDLE option argument for XCLAIM"))?;
                when = now - v;
            } else if eq(o, "time") && more > 0 {
                j += 1;
                when = proto::int::parse_i64(&a[j])
                    .ok_or(bad("Invalid TIME option argument for XCLAIM"))?;
            } else if eq(o, "retrycount") && more > 0 {
                j += 1;
                retry = proto::int::parse_i64(&a[j])
                    .ok_or(bad("Invalid RETRYCOUNT option argument for XCLAIM"))?;
            } else if eq(o, "lastid") && more > 0 {
                j += 1;
                last = strict_id(&a[j])?;
            } else {
                return Err(CmdError::Text(format!(
                    "ERR Unrecognized XCLAIM option '{}'",
                    String::from_utf8_lossy(o)
                )));
            }
            j += 1;
        }
        let mut changed = false;
        if last > s.head.groups[gi].last {
            s.head.groups[gi].last = last;
            changed = true;
        }
        let delivered = if when < 0 || when > now { now } else { when };
        let name = &a[3];
        let mut out = Vec::new();
        for id in ids {
            let found = pel_find(ctx, &mut s.head, gi, id)?;
            let Some(m) = entry(ctx, &mut s.head, id)? else {
                if let Some((pos, _)) = found {
                    pel_remove_at(ctx, &mut s.head, gi, pos)?;
                    changed = true;
                }
                continue;
            };
            let mut p = match found {
                Some((_, p)) => {
                    if minidle > 0 && now - p.delivered < minidle {
                        continue;
                    }
                    p
                }
                None if force => Pending {
                    id,
                    delivered: now,
                    count: 1,
                    consumer: Vec::new(),
                },
                None => continue,
            };
            consumer_seen(ctx, &mut s.head, gi, name, (c.db, &a[1]));
            p.delivered = delivered;
            if retry >= 0 {
                p.count = retry as u64;
            } else if !justid {
                p.count += 1;
            }
            p.consumer = name.clone();
            pel_put(ctx, &mut s.head, gi, &p)?;
            changed = true;
            out.push(if justid {
                id_reply(id)
            } else {
                entry_reply(&m)?
            });
        }
        if changed {
            save(ctx, &sk, &s);
        }
        c.reply(&Reply::Array(out));
        Ok(())
    })
}

pub fn xautoclaim(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let minidle = proto::int::parse_i64(&a[4])
        .ok_or(CmdError::Msg(
            "Invalid min-idle-time argument for XAUTOCLAIM",
        ))?
        .max(0);
    let start = interval(&a[5], 0, true)?;
    let mut count: i64 = 100;
    let mut justid = false;
    let mut j = 6;
    while j < a.len() {
        let more = a.len() - 1 - j;
        if eq(&a[j], "count") && more > 0 {
            let max = i64::MAX / 16;
            count = match proto::int::parse_i64(&a[j + 1]) {
                Some(n) if (1..=max).contains(&n) => n,
                _ => return Err(CmdError::Msg("COUNT must be > 0")),
            };
            j += 1;
        } else if eq(&a[j], "justid") {
            justid = true;
        } else {
            return Err(CmdError::Syntax);
        }
        j += 1;
    }
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let Some((mut s, gi)) = stream_group(ctx, &sk, &a[2])? else {
            return Err(nogroup(&a[1], &a[2], ""));
        };
        let now = ctx.now;
        let name = &a[3];
        let mut attempts = count.saturating_mul(10);
        let mut claimed = Vec::new();
        let mut deleted = Vec::new();
        let mut changed = false;
        let mut pos = pel_seek(ctx, &mut s.head, gi, start)?;
        while attempts > 0 && count > 0 {
            attempts -= 1;
            let Some(mut p) = pel_at(ctx, &mut s.head, gi, pos)? else {
                break;
            };
            let Some(m) = entry(ctx, &mut s.head, p.id)? else {
                pel_remove_at(ctx, &mut s.head, gi, pos)?;
                deleted.push(id_reply(p.id));
                changed = true;
                count -= 1;
                continue;
            };
            pos += 1;
            if minidle > 0 && now - p.delivered < minidle {
                continue;
            }
            consumer_seen(ctx, &mut s.head, gi, name, (c.db, &a[1]));
            p.delivered = now;
            if !justid {
                p.count += 1;
            }
            p.consumer = name.clone();
            pel_put(ctx, &mut s.head, gi, &p)?;
            changed = true;
            claimed.push(if justid {
                id_reply(p.id)
            } else {
                entry_reply(&m)?
            });
            count -= 1;
        }
        let next = pel_at(ctx, &mut s.head, gi, pos)?.map_or(Sid::MIN, |p| p.id);
        if changed {
            save(ctx, &sk, &s);
        }
        c.reply(&Reply::Array(vec![
            id_reply(next),
            Reply::Array(claimed),
            Reply::Array(deleted),
        ]));
        Ok(())
    })
}

// ---- XINFO ----

pub fn xinfo(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sub = &a[1];
    sub_arity(
        "xinfo",
        sub,
        a.len(),
        &[("consumers", 4), ("groups", 3), ("help", 2), ("stream", -3)],
    )?;
    if eq(sub, "help") {
        super::help(
            c,
            &[
                "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "CONSUMERS <key> <groupname>",
                "    Show consumers of <groupname>.",
                "GROUPS <key>",
                "    Show the stream consumer groups.",
                "STREAM <key> [FULL [COUNT <count>]",
                "    Show information about the stream.",
                "HELP",
                "    Prints this help.",
            ],
        );
        return Ok(());
    }
    // Past `sub_arity`, every subcommand names its key at 2.
    let syntax = || CmdError::SubcommandArgs {
        cmd: "XINFO",
        sub: sub.clone(),
    };
    let sk = skey(c.db, &a[2]);
    locked(ctx, &[&sk], |ctx| {
        let Some(mut s) = load(ctx, &sk)? else {
            return Err(CmdError::NoSuchKey);
        };
        let now = ctx.now;
        let b = |t: &str| Reply::Bulk(t.as_bytes().to_vec());
        if eq(sub, "consumers") && a.len() == 4 {
            let Ok(gi) = s.head.group(&a[3]) else {
                return Err(CmdError::Text(format!(
                    "NOGROUP No such consumer group '{}' for key name '{}'",
                    String::from_utf8_lossy(&a[3]),
                    String::from_utf8_lossy(&a[2])
                )));
            };
            let list = s.head.groups[gi]
                .consumers
                .iter()
                .map(|cs| {
                    Reply::Map(vec![
                        (b("name"), Reply::Bulk(cs.name.clone())),
                        (b("pending"), Reply::Integer(cs.pending as i64)),
                        (b("idle"), Reply::Integer((now - cs.seen).max(0))),
                    ])
                })
                .collect();
            c.reply(&Reply::Array(list));
        } else if eq(sub, "groups") && a.len() == 3 {
            let first = first_id(ctx, &mut s.head)?;
            let h = &s.head;
            let list = h
                .groups
                .iter()
                .map(|g| {
                    Reply::Map(vec![
                        (b("name"), Reply::Bulk(g.name.clone())),
                        (b("consumers"), Reply::Integer(g.consumers.len() as i64)),
                        (b("pending"), Reply::Integer(g.pel.count as i64)),
                        (b("last-delivered-id"), id_reply(g.last)),
                        (
                            b("entries-read"),
                            opt_int((g.entries_read != -1).then_some(g.entries_read)),
                        ),
                        (b("lag"), opt_int(lag(h, first, g))),
                    ])
                })
                .collect();
            c.reply(&Reply::Array(list));
        } else if eq(sub, "stream") {
            let opts = &a[3..];
            let (full, count) = match opts.len() {
                0 => (false, 10),
                1 if eq(&opts[0], "full") => (true, 10),
                3 if eq(&opts[0], "full") && eq(&opts[1], "count") => {
                    let n = int_arg(&opts[2])?;
                    (true, if n < 0 { 10 } else { n as usize })
                }
                _ => return Err(syntax()),
            };
            let first = first_id(ctx, &mut s.head)?;
            let len = s.head.entries.count;
            // Redis's radix tree holds about one node per 100 entries.
            let keys = len.div_ceil(100);
            let mut m = vec![
                (b("length"), Reply::Integer(len as i64)),
                (b("radix-tree-keys"), Reply::Integer(keys as i64)),
                (b("radix-tree-nodes"), Reply::Integer(keys as i64 + 1)),
                (b("last-generated-id"), id_reply(s.head.last)),
                (b("max-deleted-entry-id"), id_reply(s.head.max_deleted)),
                (
                    b("entries-added"),
                    Reply::Integer(s.head.entries_added as i64),
                ),
                (b("recorded-first-entry-id"), id_reply(first)),
            ];
            if !full {
                m.push((b("groups"), Reply::Integer(s.head.groups.len() as i64)));
                let firsts = range(ctx, &mut s.head, Sid::MIN, Sid::MAX, 1, false)?;
                let lasts = range(ctx, &mut s.head, Sid::MIN, Sid::MAX, 1, true)?;
                for (name, v) in [("first-entry", firsts), ("last-entry", lasts)] {
                    let r = match v.first() {
                        Some(e) => entry_reply(e)?,
                        None => Reply::Null,
                    };
                    m.push((b(name), r));
                }
            } else {
                let entries = range(ctx, &mut s.head, Sid::MIN, Sid::MAX, count, false)?
                    .iter()
                    .map(|e| entry_reply(e))
                    .collect::<Result<Vec<_>, _>>()?;
                m.push((b("entries"), Reply::Array(entries)));
                let mut groups = Vec::new();
                for gi in 0..s.head.groups.len() {
                    groups.push(full_group(ctx, &mut s.head, gi, first, count)?);
                }
                m.push((b("groups"), Reply::Array(groups)));
            }
            c.reply(&Reply::Map(m));
        } else {
            return Err(syntax());
        }
        Ok(())
    })
}

/// One group of XINFO STREAM FULL: its state, its PEL and its consumers
/// with theirs (each at most `count` entries, 0: all).
fn full_group(
    ctx: &mut Ctx,
    h: &mut StreamHead,
    gi: usize,
    first: Sid,
    count: usize,
) -> Result<Reply, CmdError> {
    let b = |t: &str| Reply::Bulk(t.as_bytes().to_vec());
    let mut pel = Vec::new();
    let mut pos = 0;
    while count == 0 || pel.len() < count {
        let Some(p) = pel_at(ctx, h, gi, pos)? else {
            break;
        };
        pos += 1;
        pel.push(Reply::Array(vec![
            id_reply(p.id),
            Reply::Bulk(p.consumer),
            Reply::Integer(p.delivered),
            Reply::Integer(p.count as i64),
        ]));
    }
    let mut consumers = Vec::new();
    let names: Vec<(Vec<u8>, i64, u64)> = h.groups[gi]
        .consumers
        .iter()
        .map(|c| (c.name.clone(), c.seen, c.pending))
        .collect();
    for (name, seen, pending) in names {
        let mut own = Vec::new();
        let mut pos = 0;
        while count == 0 || own.len() < count {
            let Some(p) = pel_at(ctx, h, gi, pos)? else {
                break;
            };
            pos += 1;
            if p.consumer == name {
                own.push(Reply::Array(vec![
                    id_reply(p.id),
                    Reply::Integer(p.delivered),
                    Reply::Integer(p.count as i64),
                ]));
            }
        }
        consumers.push(Reply::Map(vec![
            (b("name"), Reply::Bulk(name)),
            (b("seen-time"), Reply::Integer(seen)),
            (b("pel-count"), Reply::Integer(pending as i64)),
            (b("pending"), Reply::Array(own)),
        ]));
    }
    let g = &h.groups[gi];
    Ok(Reply::Map(vec![
        (b("name"), Reply::Bulk(g.name.clone())),
        (b("last-delivered-id"), id_reply(g.last)),
        (
            b("entries-read"),
            opt_int((g.entries_read != -1).then_some(g.entries_read)),
        ),
        (b("lag"), opt_int(lag(h, first, g))),
        (b("pel-count"), Reply::Integer(g.pel.count as i64)),
        (b("pending"), Reply::Array(pel)),
        (b("consumers"), Reply::Array(consumers)),
    ]))
}

/// The whole stream at `sk` (DUMP; the unit holds its lock), None when
/// absent.
pub(crate) fn export(
    ctx: &mut Ctx,
    sk: &[u8],
) -> Result<Option<crate::rdb::StreamValue>, CmdError> {
    let Some(mut s) = load(ctx, sk)? else {
        return Ok(None);
    };
    let h = &mut s.head;
    let members = range(ctx, h, Sid::MIN, Sid::MAX, 0, false)?;
    let mut entries = Vec::with_capacity(members.len());
    for m in &members {
        entries.push(decode_entry(m)?);
    }
    let first = first_id(ctx, h)?;
    let mut groups = Vec::with_capacity(h.groups.len());
    for gi in 0..h.groups.len() {
        let mut pel = Vec::new();
        let mut pos = 0;
        while let Some(p) = pel_at(ctx, h, gi, pos)? {
            pos += 1;
            pel.push((p.id, p.delivered, p.count, p.consumer));
        }
        let g = &h.groups[gi];
        groups.push(crate::rdb::GroupValue {
            name: g.name.clone(),
            last: g.last,
            entries_read: g.entries_read,
            pel,
            consumers: g
                .consumers
                .iter()
                .map(|c| (c.name.clone(), c.seen))
                .collect(),
        });
    }
    Ok(Some(crate::rdb::StreamValue {
        entries,
        last: h.last,
        first,
        max_deleted: h.max_deleted,
        entries_added: h.entries_added,
        groups,
    }))
}

/// Stages stream `v` at `sk`, which is absent (RESTORE; the unit holds its
/// lock): every tree bulk-loaded, each piece written once.
pub(crate) fn import(
    ctx: &mut Ctx,
    sk: &[u8],
    v: &crate::rdb::StreamValue,
) -> Result<(), CmdError> {
    let bad = || CmdError::Msg("Bad data format");
    let mut s = new_stream(ctx);
    let h = &mut s.head;
    let members: Vec<Entry> = v
        .entries
        .iter()
        .map(|(id, pairs)| {
            let refs: Vec<(&[u8], &[u8])> = pairs
                .iter()
                .map(|(f, x)| (f.as_slice(), x.as_slice()))
                .collect();
            Entry::new(0.0, entry_member(*id, &refs))
        })
        .collect();
    let cid = h.id;
    with_tree(ctx, cid, &mut h.entries, |t| t.bulk_load(members))?;
    h.last = v.last;
    h.max_deleted = v.max_deleted;
    h.entries_added = v.entries_added;
    for g in &v.groups {
        let Err(at) = h.group(&g.name) else {
            return Err(bad());
        };
        let slot = h.next_slot;
        h.next_slot += 1;
        let mut grp = Group::new(g.name.clone(), g.last, g.entries_read, slot);
        for (name, seen) in &g.consumers {
            match grp.consumer(name) {
                Ok(_) => return Err(bad()),
                Err(i) => grp.consumers.insert(
                    i,
                    Consumer {
                        name: name.clone(),
                        seen: *seen,
                        pending: 0,
                    },
                ),
            }
        }
        let mut pel = Vec::with_capacity(g.pel.len());
        for (id, delivered, count, consumer) in &g.pel {
            let Ok(i) = grp.consumer(consumer) else {
                return Err(bad());
            };
            grp.consumers[i].pending += 1;
            let p = Pending {
                id: *id,
                delivered: *delivered,
                count: *count,
                consumer: consumer.clone(),
            };
            pel.push(Entry::new(0.0, p.member()));
        }
        with_tree(ctx, cid, &mut grp.pel, |t| t.bulk_load(pel))?;
        h.groups.insert(at, grp);
    }
    save(ctx, sk, &s);
    Ok(())
}

/// OBJECT ENCODING of a stream.
pub(crate) fn encoding() -> &'static str {
    "stream"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_as_redis_parses_them() {
        assert_eq!(string2ull(b"039"), Some(39));
        assert_eq!(string2ull(b" +7"), Some(7));
        assert_eq!(string2ull(b"-0"), Some(0));
        assert_eq!(string2ull(b"-1"), None);
        assert_eq!(string2ull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(string2ull(b"18446744073709551616"), None);
        assert_eq!(string2ull(b""), None);
        assert_eq!(string2ull(b"1x"), None);
        let p = |a: &[u8]| parse_id(a, 0, true, true).map(|(id, given)| (id.to_string(), given));
        assert_eq!(p(b"5--0").unwrap(), ("5-0".into(), true));
        assert_eq!(p(b"5-*").unwrap(), ("5-0".into(), false));
        assert_eq!(p(b"5").unwrap(), ("5-0".into(), true));
        assert!(p(b"-").is_err() && p(b"-5").is_err() && p(b"5-x").is_err());
        assert_eq!(interval(b"(5", 0, true).unwrap(), Sid::new(5, 1));
        assert_eq!(
            interval(b"(5", u64::MAX, false).unwrap(),
            Sid::new(5, u64::MAX - 1)
        );
        assert!(interval(b"(0-0", 0, false).is_err());
    }
}
