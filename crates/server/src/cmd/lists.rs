//! List commands. A list is inline (one head value holding every element)
//! while it has at most 128 elements and 8 KiB, and a positional counted
//! B+-tree of pieces after (`engine::types::tree`): pushes and pops at
//! either end, LINDEX and LSET cost O(log n) pieces, LRANGE O(log n + m).
//! Redis 7.0 calls every list's encoding `quicklist`. Every command runs
//! under the key's stripe lock, readers included (`crate::coll`).
//!
//! The blocking commands (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP) are
//! their non-blocking forms as [`crate::blocking`] serve functions: each
//! tries one key under the stripe locks `blocking` takes, and `blocking`
//! makes the client wait when none serves.

use super::{eq, int_arg, locked, CmdError, Ctx, R};
use crate::blocking::{self, Try, Wait};
use crate::coll::{self, KsPieces};
use crate::keyspace::{skey, KIND_LIST};
use crate::notify::{self, event};
use crate::server::Client;
use engine::types::head::ListHead;
use engine::types::node::Entry;
use engine::types::tree::{Meta, Tree, LIMITS};
use proto::Reply;

/// A list read under its stripe lock.
struct List {
    expire: Option<i64>,
    head: ListHead,
}

fn load(ctx: &mut Ctx, sk: &[u8]) -> Result<Option<List>, CmdError> {
    Ok(super::load_head(ctx, sk, KIND_LIST, ListHead::decode)?
        .map(|(expire, head)| List { expire, head }))
}

/// Stages the list's new head; an emptied list is deleted.
fn save(ctx: &mut Ctx, sk: &[u8], l: &List) {
    super::save_head(ctx, sk, KIND_LIST, l.expire, l.head.is_empty(), |out| {
        l.head.encode(out)
    });
}

fn new_list() -> List {
    List {
        expire: None,
        head: ListHead::Inline(Vec::new()),
    }
}

/// Runs `f` on the tree of a list head.
fn with_tree<T>(
    ctx: &mut Ctx,
    id: u64,
    meta: &mut Meta,
    f: impl FnOnce(&mut Tree<KsPieces>) -> engine::Result<T>,
) -> Result<T, CmdError> {
    let mut p = KsPieces::new(ctx.ks, id);
    let mut t = Tree::new(&mut p, meta, false);
    Ok(f(&mut t)?)
}

/// An inline list that outgrew one leaf becomes a tree (for good, as a
/// Redis quicklist stays one).
fn grow(ctx: &mut Ctx, head: &mut ListHead) -> Result<(), CmdError> {
    let ListHead::Inline(v) = head else {
        return Ok(());
    };
    let bytes: usize = v.iter().map(|e| e.encoded_len(false)).sum();
    if v.len() <= LIMITS.leaf_entries && bytes <= LIMITS.leaf_bytes {
        return Ok(());
    }
    let items = std::mem::take(v);
    coll::mark_pieced(ctx.sh, ctx.ks);
    let id = coll::new_id();
    let mut meta = Meta::new();
    with_tree(ctx, id, &mut meta, |t| {
        for (i, e) in items.into_iter().enumerate() {
            t.insert_at(i as u64, e.bytes)?;
        }
        Ok(())
    })?;
    *head = ListHead::Tree { id, meta };
    Ok(())
}

fn insert_at(ctx: &mut Ctx, head: &mut ListHead, pos: u64, v: &[u8]) -> Result<(), CmdError> {
    match head {
        ListHead::Inline(items) => {
            items.insert(pos as usize, Entry::new(0.0, v.to_vec()));
            grow(ctx, head)
        }
        ListHead::Tree { id, meta } => with_tree(ctx, *id, meta, |t| t.insert_at(pos, v.to_vec())),
    }
}

fn push(ctx: &mut Ctx, head: &mut ListHead, left: bool, v: &[u8]) -> Result<(), CmdError> {
    let pos = if left { 0 } else { head.len() };
    insert_at(ctx, head, pos, v)
}

fn remove_at(ctx: &mut Ctx, head: &mut ListHead, pos: u64) -> Result<Vec<u8>, CmdError> {
    match head {
        ListHead::Inline(items) => Ok(items.remove(pos as usize).bytes),
        ListHead::Tree { id, meta } => with_tree(ctx, *id, meta, |t| t.remove_at(pos)),
    }
}

fn pop(ctx: &mut Ctx, head: &mut ListHead, left: bool) -> Result<Option<Vec<u8>>, CmdError> {
    if head.is_empty() {
        return Ok(None);
    }
    let pos = if left { 0 } else { head.len() - 1 };
    remove_at(ctx, head, pos).map(Some)
}

fn get(ctx: &mut Ctx, head: &mut ListHead, pos: u64) -> Result<Vec<u8>, CmdError> {
    match head {
        ListHead::Inline(items) => Ok(items[pos as usize].bytes.clone()),
        ListHead::Tree { id, meta } => Ok(with_tree(ctx, *id, meta, |t| t.get_at(pos))?.bytes),
    }
}

fn set(ctx: &mut Ctx, head: &mut ListHead, pos: u64, v: &[u8]) -> Result<(), CmdError> {
    match head {
        ListHead::Inline(items) => {
            items[pos as usize] = Entry::new(0.0, v.to_vec());
            grow(ctx, head)
        }
        ListHead::Tree { id, meta } => with_tree(ctx, *id, meta, |t| t.set_at(pos, v.to_vec())),
    }
}

/// Elements `start..=end` (valid positions), reversed when `reverse`.
fn range(
    ctx: &mut Ctx,
    head: &mut ListHead,
    start: u64,
    end: u64,
    reverse: bool,
) -> Result<Vec<Vec<u8>>, CmdError> {
    let mut out = Vec::with_capacity((end - start + 1).min(1 << 16) as usize);
    match head {
        ListHead::Inline(items) => {
            let s = &items[start as usize..=end as usize];
            if reverse {
                out.extend(s.iter().rev().map(|e| e.bytes.clone()));
            } else {
                out.extend(s.iter().map(|e| e.bytes.clone()));
            }
        }
        ListHead::Tree { id, meta } => with_tree(ctx, *id, meta, |t| {
            t.for_range(start, end, reverse, |e| {
                out.push(e.bytes.clone());
                true
            })
        })?,
    }
    Ok(out)
}

/// Every element of the list at `sk` (stripe lock held), in order: None
/// when absent, WRONGTYPE for another type (SORT's input).
pub(crate) fn items(ctx: &mut Ctx, sk: &[u8]) -> Result<Option<Vec<Vec<u8>>>, CmdError> {
    let Some(mut l) = load(ctx, sk)? else {
        return Ok(None);
    };
    match l.head.len() {
        0 => Ok(Some(Vec::new())),
        n => range(ctx, &mut l.head, 0, n - 1, false).map(Some),
    }
}

/// Stages `items` as the new list at `dst`, replacing whatever it held
/// (SORT ... STORE); no items deletes `dst`. One batch with the command's
/// other writes.
pub(crate) fn store(ctx: &mut Ctx, dst: &[u8], items: Vec<Vec<u8>>) -> Result<bool, CmdError> {
    let existed = ctx.ks.delete(dst, ctx.now)?;
    if items.is_empty() {
        return Ok(existed);
    }
    let mut l = new_list();
    l.head = ListHead::Inline(items.into_iter().map(|b| Entry::new(0.0, b)).collect());
    grow(ctx, &mut l.head)?;
    save(ctx, dst, &l);
    Ok(existed)
}

/// Redis's range normalisation (LRANGE, LTRIM): negative indexes count
/// from the end; None when the range is empty.
fn norm_range(start: i64, end: i64, len: u64) -> Option<(u64, u64)> {
    let len = len as i64;
    let start = if start < 0 {
        (len + start).max(0)
    } else {
        start
    };
    let end = if end < 0 { len + end } else { end };
    if start > end || start >= len {
        return None;
    }
    Some((start as u64, end.min(len - 1) as u64))
}

/// A position from a possibly negative index; None out of range.
fn norm_index(idx: i64, len: u64) -> Option<u64> {
    let i = if idx < 0 {
        idx.checked_add(len as i64)?
    } else {
        idx
    };
    (0..len as i64).contains(&i).then_some(i as u64)
}

fn side(a: &[u8]) -> Result<bool, CmdError> {
    if eq(a, "left") {
        Ok(true)
    } else if eq(a, "right") {
        Ok(false)
    } else {
        Err(CmdError::Syntax)
    }
}

fn push_cmd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], left: bool, only_existing: bool) -> R {
    let sk = skey(c.db, &a[1]);
    let n = locked(ctx, &[&sk], |ctx| {
        let mut l = match load(ctx, &sk)? {
            Some(l) => l,
            None if only_existing => return Ok(0),
            None => new_list(),
        };
        for v in &a[2..] {
            push(ctx, &mut l.head, left, v)?;
        }
        save(ctx, &sk, &l);
        Ok(l.head.len())
    })?;
    c.int(n as i64);
    if n > 0 {
        event(ctx, notify::LIST, push_name(left), c.db, &a[1]);
    }
    Ok(())
}

fn push_name(left: bool) -> &'static str {
    if left {
        "lpush"
    } else {
        "rpush"
    }
}

/// The events of elements popped from `key`: `lpop`/`rpop`, then `del`
/// when that emptied it.
fn pop_events(ctx: &mut Ctx, db: u8, key: &[u8], left: bool, emptied: bool) {
    event(
        ctx,
        notify::LIST,
        if left { "lpop" } else { "rpop" },
        db,
        key,
    );
    if emptied {
        event(ctx, notify::GENERIC, "del", db, key);
    }
}

pub fn lpush(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    push_cmd(ctx, c, a, true, false)
}
pub fn rpush(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    push_cmd(ctx, c, a, false, false)
}
pub fn lpushx(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    push_cmd(ctx, c, a, true, true)
}
pub fn rpushx(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    push_cmd(ctx, c, a, false, true)
}

/// Elements popped, and whether that emptied (deleted) the list.
type Popped = (Vec<Vec<u8>>, bool);

/// Pops up to `count` elements from one end of the list at `sk` (stripe
/// lock held); None when the key is absent.
fn pop_n(ctx: &mut Ctx, sk: &[u8], left: bool, count: u64) -> Result<Option<Popped>, CmdError> {
    let Some(mut l) = load(ctx, sk)? else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for _ in 0..count.min(l.head.len()) {
        out.extend(pop(ctx, &mut l.head, left)?);
    }
    if !out.is_empty() {
        save(ctx, sk, &l);
    }
    Ok(Some((out, l.head.is_empty())))
}

fn pop_cmd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], left: bool) -> R {
    let count = match a.len() {
        2 => None,
        3 => Some(
            proto::int::parse_i64(&a[2])
                .filter(|&n| n >= 0)
                .ok_or(CmdError::MustBePositive)? as u64,
        ),
        _ => return Err(super::arity_error(if left { "lpop" } else { "rpop" })),
    };
    let sk = skey(c.db, &a[1]);
    let popped = locked(ctx, &[&sk], |ctx| pop_n(ctx, &sk, left, count.unwrap_or(1)))?;
    if let Some((v, emptied)) = &popped {
        if !v.is_empty() {
            pop_events(ctx, c.db, &a[1], left, *emptied);
        }
    }
    let popped = popped.map(|(v, _)| v);
    match (count, popped) {
        (None, Some(mut v)) if !v.is_empty() => c.bulk(&v.swap_remove(0)),
        (None, _) => c.null(),
        (Some(_), None) => c.reply(&Reply::NullArray),
        (Some(_), Some(v)) => {
            c.array_header(v.len());
            for e in v {
                c.bulk(&e);
            }
        }
    }
    Ok(())
}

pub fn lpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    pop_cmd(ctx, c, a, true)
}
pub fn rpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    pop_cmd(ctx, c, a, false)
}

/// Runs `f` on the list at `key` under its stripe lock, for a reader.
fn read<T>(
    ctx: &mut Ctx,
    c: &Client,
    key: &[u8],
    f: impl FnOnce(&mut Ctx, Option<&mut ListHead>) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    let sk = skey(c.db, key);
    locked(ctx, &[&sk], |ctx| {
        let mut l = load(ctx, &sk)?;
        f(ctx, l.as_mut().map(|l| &mut l.head))
    })
}

pub fn llen(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let n = read(ctx, c, &a[1], |_, h| Ok(h.map_or(0, |h| h.len())))?;
    c.int(n as i64);
    Ok(())
}

pub fn lindex(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let v = read(ctx, c, &a[1], |ctx, h| {
        let Some(h) = h else {
            return Ok(None);
        };
        let idx = int_arg(&a[2])?;
        match norm_index(idx, h.len()) {
            Some(p) => get(ctx, h, p).map(Some),
            None => Ok(None),
        }
    })?;
    match v {
        Some(v) => c.bulk(&v),
        None => c.null(),
    }
    Ok(())
}

pub fn lset(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let Some(mut l) = load(ctx, &sk)? else {
            return Err(CmdError::NoSuchKey);
        };
        let idx = int_arg(&a[2])?;
        let p = norm_index(idx, l.head.len()).ok_or(CmdError::IndexOutOfRange)?;
        set(ctx, &mut l.head, p, &a[3])?;
        save(ctx, &sk, &l);
        Ok(())
    })?;
    c.ok();
    event(ctx, notify::LIST, "lset", c.db, &a[1]);
    Ok(())
}

pub fn lrange(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (start, end) = (int_arg(&a[2])?, int_arg(&a[3])?);
    let items = read(ctx, c, &a[1], |ctx, h| {
        let Some(h) = h else {
            return Ok(Vec::new());
        };
        match norm_range(start, end, h.len()) {
            Some((s, e)) => range(ctx, h, s, e, false),
            None => Ok(Vec::new()),
        }
    })?;
    c.array_header(items.len());
    for v in items {
        c.bulk(&v);
    }
    Ok(())
}

pub fn ltrim(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (start, end) = (int_arg(&a[2])?, int_arg(&a[3])?);
    let sk = skey(c.db, &a[1]);
    let trimmed = locked(ctx, &[&sk], |ctx| {
        let Some(mut l) = load(ctx, &sk)? else {
            return Ok(None);
        };
        let len = l.head.len();
        let (left, right) = match norm_range(start, end, len) {
            Some((s, e)) => (s, len - e - 1),
            None => (len, 0),
        };
        for _ in 0..right {
            pop(ctx, &mut l.head, false)?;
        }
        for _ in 0..left {
            pop(ctx, &mut l.head, true)?;
        }
        if left + right > 0 {
            save(ctx, &sk, &l);
        }
        Ok(Some(l.head.is_empty()))
    })?;
    c.ok();
    if let Some(emptied) = trimmed {
        event(ctx, notify::LIST, "ltrim", c.db, &a[1]);
        if emptied {
            event(ctx, notify::GENERIC, "del", c.db, &a[1]);
        }
    }
    Ok(())
}

/// Every element, in order (LREM, LPOS, LINSERT scan the list as Redis
/// does: O(n)).
fn all(ctx: &mut Ctx, head: &mut ListHead) -> Result<Vec<Vec<u8>>, CmdError> {
    if head.is_empty() {
        return Ok(Vec::new());
    }
    let last = head.len() - 1;
    range(ctx, head, 0, last, false)
}

pub fn lrem(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let count = int_arg(&a[2])?;
    let sk = skey(c.db, &a[1]);
    let removed = locked(ctx, &[&sk], |ctx| {
        let Some(mut l) = load(ctx, &sk)? else {
            return Ok((0, false));
        };
        let items = all(ctx, &mut l.head)?;
        let mut hits: Vec<u64> = items
            .iter()
            .enumerate()
            .filter(|(_, v)| v.as_slice() == a[3].as_slice())
            .map(|(i, _)| i as u64)
            .collect();
        if count < 0 {
            hits.reverse();
        }
        if count != 0 {
            hits.truncate(count.unsigned_abs().min(usize::MAX as u64) as usize);
        }
        // Remove from the back so earlier positions stay valid.
        hits.sort_unstable_by(|x, y| y.cmp(x));
        for &p in &hits {
            remove_at(ctx, &mut l.head, p)?;
        }
        if !hits.is_empty() {
            save(ctx, &sk, &l);
        }
        Ok((hits.len(), l.head.is_empty()))
    })?;
    c.int(removed.0 as i64);
    if removed.0 > 0 {
        event(ctx, notify::LIST, "lrem", c.db, &a[1]);
        if removed.1 {
            event(ctx, notify::GENERIC, "del", c.db, &a[1]);
        }
    }
    Ok(())
}

pub fn linsert(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let after = if eq(&a[2], "after") {
        true
    } else if eq(&a[2], "before") {
        false
    } else {
        return Err(CmdError::Syntax);
    };
    let sk = skey(c.db, &a[1]);
    let n = locked(ctx, &[&sk], |ctx| {
        let Some(mut l) = load(ctx, &sk)? else {
            return Ok(0);
        };
        let items = all(ctx, &mut l.head)?;
        let Some(p) = items.iter().position(|v| v.as_slice() == a[3].as_slice()) else {
            return Ok(-1);
        };
        insert_at(ctx, &mut l.head, p as u64 + after as u64, &a[4])?;
        save(ctx, &sk, &l);
        Ok(l.head.len() as i64)
    })?;
    c.int(n);
    if n > 0 {
        event(ctx, notify::LIST, "linsert", c.db, &a[1]);
    }
    Ok(())
}

/// LPOS key element [RANK rank] [COUNT num-matches] [MAXLEN len].
pub fn lpos(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (mut rank, mut count, mut maxlen) = (1i64, None::<u64>, 0u64);
    let mut j = 3;
    while j < a.len() {
        let more = j + 1 < a.len();
        if eq(&a[j], "rank") && more {
            rank = int_arg(&a[j + 1])?;
            if rank == 0 {
                return Err(CmdError::RankZero);
            }
        } else if eq(&a[j], "count") && more {
            count = Some(
                proto::int::parse_i64(&a[j + 1])
                    .filter(|&n| n >= 0)
                    .ok_or(CmdError::CountNegative)? as u64,
            );
        } else if eq(&a[j], "maxlen") && more {
            maxlen = proto::int::parse_i64(&a[j + 1])
                .filter(|&n| n >= 0)
                .ok_or(CmdError::MaxlenNegative)? as u64;
        } else {
            return Err(CmdError::Syntax);
        }
        j += 2;
    }
    let found = read(ctx, c, &a[1], |ctx, h| {
        let Some(h) = h else {
            return Ok(None);
        };
        let items = all(ctx, h)?;
        let len = items.len();
        let order: Box<dyn Iterator<Item = usize>> = if rank > 0 {
            Box::new(0..len)
        } else {
            Box::new((0..len).rev())
        };
        let skip = rank.unsigned_abs() - 1;
        let want = match count {
            None => 1,
            Some(0) => u64::MAX,
            Some(n) => n,
        };
        let mut out = Vec::new();
        let mut matches = 0u64;
        for (scanned, i) in order.enumerate() {
            if maxlen > 0 && scanned as u64 >= maxlen {
                break;
            }
            if items[i] == a[2] {
                matches += 1;
                if matches > skip {
                    out.push(i as i64);
                    if out.len() as u64 >= want {
                        break;
                    }
                }
            }
        }
        Ok(Some(out))
    })?;
    match (count, found) {
        (None, Some(v)) if !v.is_empty() => c.int(v[0]),
        (None, _) => c.null(),
        (Some(_), v) => {
            let v = v.unwrap_or_default();
            c.array_header(v.len());
            for i in v {
                c.int(i);
            }
        }
    }
    Ok(())
}

/// Moves one element from an end of `src` to an end of `dst` (the same
/// list when the keys are equal); None when `src` is absent.
fn lmove_generic(
    ctx: &mut Ctx,
    c: &Client,
    src: &[u8],
    dst: &[u8],
    from_left: bool,
    to_left: bool,
) -> Result<Option<Vec<u8>>, CmdError> {
    let (s, d) = (skey(c.db, src), skey(c.db, dst));
    let moved = locked(ctx, &[&s, &d], |ctx| {
        let Some(sl) = load(ctx, &s)? else {
            return Ok(None);
        };
        move_locked(ctx, &s, &d, sl, from_left, to_left)
    })?;
    Ok(moved.map(|(v, emptied)| {
        move_events(ctx, c.db, src, dst, from_left, to_left, emptied);
        v
    }))
}

/// The events of LMOVE: the push on the destination, then the pop (and
/// the source's `del` when emptied).
fn move_events(
    ctx: &mut Ctx,
    db: u8,
    src: &[u8],
    dst: &[u8],
    from_left: bool,
    to_left: bool,
    emptied: bool,
) {
    event(ctx, notify::LIST, push_name(to_left), db, dst);
    pop_events(ctx, db, src, from_left, emptied);
}

/// LMOVE's move from the list `sl` read at `s` to `d` (stripe locks of
/// both held): WRONGTYPE when `d` holds another type. The element moved,
/// and whether the source was emptied.
fn move_locked(
    ctx: &mut Ctx,
    s: &[u8],
    d: &[u8],
    mut sl: List,
    from_left: bool,
    to_left: bool,
) -> Result<Option<(Vec<u8>, bool)>, CmdError> {
    if s == d {
        let Some(v) = pop(ctx, &mut sl.head, from_left)? else {
            return Ok(None);
        };
        push(ctx, &mut sl.head, to_left, &v)?;
        save(ctx, s, &sl);
        return Ok(Some((v, false)));
    }
    let mut dl = load(ctx, d)?.unwrap_or_else(new_list);
    let Some(v) = pop(ctx, &mut sl.head, from_left)? else {
        return Ok(None);
    };
    push(ctx, &mut dl.head, to_left, &v)?;
    save(ctx, s, &sl);
    save(ctx, d, &dl);
    Ok(Some((v, sl.head.is_empty())))
}

pub fn lmove(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (from, to) = (side(&a[3])?, side(&a[4])?);
    match lmove_generic(ctx, c, &a[1], &a[2], from, to)? {
        Some(v) => c.bulk(&v),
        None => c.null(),
    }
    Ok(())
}

pub fn rpoplpush(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    match lmove_generic(ctx, c, &a[1], &a[2], false, true)? {
        Some(v) => c.bulk(&v),
        None => c.null(),
    }
    Ok(())
}

/// LMPOP's and BLMPOP's arguments after `numkeys` at index `at`: the keys'
/// indexes, the end to pop from (true: left) and the count.
fn mpop_args(a: &[Vec<u8>], at: usize) -> Result<(std::ops::Range<usize>, bool, u64), CmdError> {
    let numkeys = proto::int::parse_i64(&a[at])
        .filter(|&n| n >= 1)
        .ok_or(CmdError::NumkeysNotPositive)? as usize;
    let where_idx = numkeys.checked_add(at + 1).ok_or(CmdError::Syntax)?;
    if where_idx >= a.len() {
        return Err(CmdError::Syntax);
    }
    let left = side(&a[where_idx])?;
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
    Ok((at + 1..where_idx, left, count.unwrap_or(1)))
}

/// LMPOP numkeys key [key ...] LEFT|RIGHT [COUNT count]: pops from the
/// first non-empty list.
pub fn lmpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (keys, left, count) = mpop_args(a, 1)?;
    let keys: Vec<Vec<u8>> = a[keys].iter().map(|k| skey(c.db, k)).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let popped = locked(ctx, &refs, |ctx| {
        for (i, sk) in keys.iter().enumerate() {
            if let Some((v, emptied)) = pop_n(ctx, sk, left, count)? {
                if !v.is_empty() {
                    return Ok(Some((i, v, emptied)));
                }
            }
        }
        Ok(None)
    })?;
    match popped {
        None => c.reply(&Reply::NullArray),
        Some((i, v, emptied)) => {
            mpop_reply(c, &a[2 + i], v);
            pop_events(ctx, c.db, &a[2 + i], left, emptied);
        }
    }
    Ok(())
}

/// LMPOP's and BLMPOP's reply: the key and the elements popped.
fn mpop_reply(c: &mut Client, key: &[u8], v: Vec<Vec<u8>>) {
    c.array_header(2);
    c.bulk(key);
    c.array_header(v.len());
    for e in v {
        c.bulk(&e);
    }
}

/// Pops up to `count` elements from the list at argument `i` (stripe lock
/// held): the blocking pops' serve step. `Err(try)` when nothing was
/// popped: the key is absent or holds another type.
fn try_pop(
    ctx: &mut Ctx,
    c: &Client,
    a: &[Vec<u8>],
    i: usize,
    left: bool,
    count: u64,
) -> Result<Result<Vec<Vec<u8>>, Try>, CmdError> {
    let sk = skey(c.db, &a[i]);
    match pop_n(ctx, &sk, left, count) {
        Ok(Some((v, emptied))) if !v.is_empty() => {
            // A serve step runs under `blocking`'s locks: its events are
            // published from here, before the writes are applied.
            pop_events(ctx, c.db, &a[i], left, emptied);
            Ok(Ok(v))
        }
        Ok(_) => Ok(Err(Try::Empty)),
        Err(CmdError::WrongType) => Ok(Err(Try::Mismatch)),
        Err(e) => Err(e),
    }
}

/// BLPOP's and BRPOP's serve step: one element, replied with its key.
fn serve_bpop(
    ctx: &mut Ctx,
    c: &mut Client,
    a: &[Vec<u8>],
    i: usize,
    left: bool,
) -> Result<Try, CmdError> {
    Ok(match try_pop(ctx, c, a, i, left, 1)? {
        Ok(mut v) => {
            c.array_header(2);
            c.bulk(&a[i]);
            c.bulk(&v.swap_remove(0));
            Try::Served
        }
        Err(t) => t,
    })
}

fn serve_blpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], i: usize) -> Result<Try, CmdError> {
    serve_bpop(ctx, c, a, i, true)
}

fn serve_brpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], i: usize) -> Result<Try, CmdError> {
    serve_bpop(ctx, c, a, i, false)
}

/// BLPOP/BRPOP key [key ...] timeout.
fn bpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], left: bool) -> R {
    let last = a.len() - 1;
    let timeout_ms = blocking::timeout_arg(&a[last])?;
    let w = Wait {
        keys: (1..last).collect(),
        also_lock: Vec::new(),
        timeout_ms,
        kind: KIND_LIST,
        serve: if left { serve_blpop } else { serve_brpop },
    };
    blocking::wait(ctx, c, a, w)
}

pub fn blpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    bpop(ctx, c, a, true)
}
pub fn brpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    bpop(ctx, c, a, false)
}

/// BLMOVE's and BRPOPLPUSH's serve step at the source (argument 1; the
/// destination, argument 2, is locked too): LMOVE, whose error (a
/// destination of another type) is the reply.
fn serve_move(
    ctx: &mut Ctx,
    c: &mut Client,
    a: &[Vec<u8>],
    from_left: bool,
    to_left: bool,
) -> Result<Try, CmdError> {
    let (s, d) = (skey(c.db, &a[1]), skey(c.db, &a[2]));
    let sl = match load(ctx, &s) {
        Ok(Some(l)) => l,
        Ok(None) => return Ok(Try::Empty),
        Err(CmdError::WrongType) => return Ok(Try::Mismatch),
        Err(e) => return Err(e),
    };
    match move_locked(ctx, &s, &d, sl, from_left, to_left)? {
        Some((v, emptied)) => {
            c.bulk(&v);
            move_events(ctx, c.db, &a[1], &a[2], from_left, to_left, emptied);
            Ok(Try::Served)
        }
        None => Ok(Try::Empty),
    }
}

fn serve_blmove(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], _i: usize) -> Result<Try, CmdError> {
    let (from, to) = (side(&a[3])?, side(&a[4])?);
    serve_move(ctx, c, a, from, to)
}

fn serve_brpoplpush(
    ctx: &mut Ctx,
    c: &mut Client,
    a: &[Vec<u8>],
    _i: usize,
) -> Result<Try, CmdError> {
    serve_move(ctx, c, a, false, true)
}

/// BLMOVE source destination LEFT|RIGHT LEFT|RIGHT timeout, and
/// BRPOPLPUSH source destination timeout (`timeout` its argument index).
fn bmove(
    ctx: &mut Ctx,
    c: &mut Client,
    a: &[Vec<u8>],
    timeout: usize,
    serve: blocking::Serve,
) -> R {
    let timeout_ms = blocking::timeout_arg(&a[timeout])?;
    let w = Wait {
        keys: vec![1],
        also_lock: vec![2],
        timeout_ms,
        kind: KIND_LIST,
        serve,
    };
    blocking::wait(ctx, c, a, w)
}

pub fn blmove(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    side(&a[3])?;
    side(&a[4])?;
    bmove(ctx, c, a, 5, serve_blmove)
}

pub fn brpoplpush(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    bmove(ctx, c, a, 3, serve_brpoplpush)
}

/// BLMPOP's serve step: LMPOP's reply from one key.
fn serve_blmpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], i: usize) -> Result<Try, CmdError> {
    let (_, left, count) = mpop_args(a, 2)?;
    Ok(match try_pop(ctx, c, a, i, left, count)? {
        Ok(v) => {
            mpop_reply(c, &a[i], v);
            Try::Served
        }
        Err(t) => t,
    })
}

/// BLMPOP timeout numkeys key [key ...] LEFT|RIGHT [COUNT count]; the
/// timeout is checked after the other arguments, as Redis does.
pub fn blmpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (keys, _, _) = mpop_args(a, 2)?;
    let timeout_ms = blocking::timeout_arg(&a[1])?;
    let w = Wait {
        keys: keys.collect(),
        also_lock: Vec::new(),
        timeout_ms,
        kind: KIND_LIST,
        serve: serve_blmpop,
    };
    blocking::wait(ctx, c, a, w)
}
