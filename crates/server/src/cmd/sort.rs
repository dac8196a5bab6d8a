//! SORT and SORT_RO, as Redis 7.0's `sort.c`: the elements of a list, set
//! or sorted set, sorted as numbers (ties by the elements' bytes) or, with
//! ALPHA, as strings, by themselves or by weights that a BY pattern names
//! (`weight_*`, a string key, or `w_*->field`, a hash field); LIMIT, ASC or
//! DESC; GET patterns (`#` is the element itself) replacing each element
//! with values read the same way; STORE writing the result as a list.
//!
//! Every key the command reads or writes is read under its stripe lock,
//! all of them at once, so the result is one consistent view as Redis's
//! single thread gives: the keys BY and GET name depend on the elements, so
//! the command reads the elements, derives those keys, takes every lock,
//! reads the elements again and starts over with more locks when they name
//! a key not yet locked (another client changed them in between). A STORE
//! is staged with the command's other writes: one batch, all-or-nothing
//! across a crash.

use super::{eq, lists, maps, zsets, CmdError, Ctx, R};
use crate::keyspace::{skey, KIND_HASH, KIND_LIST, KIND_SET, KIND_STRING, KIND_ZSET};
use crate::pqsort::pqsort;
use crate::server::Client;
use engine::types::head::MapHead;
use std::cmp::Ordering;
use std::collections::BTreeSet;

/// A parsed SORT request.
struct Req {
    desc: bool,
    alpha: bool,
    limit: Option<(i64, i64)>,
    store: Option<Vec<u8>>,
    by: Option<Vec<u8>>,
    /// BY names no key (no `*`): the elements keep their order.
    dontsort: bool,
    gets: Vec<Vec<u8>>,
}

/// Parses the options (Redis's `sortCommandGeneric` loop: errors in their
/// order, before the key is read). `i` is the command's table index.
fn parse(c: &Client, a: &[Vec<u8>], i: usize, readonly: bool) -> Result<Req, CmdError> {
    let mut r = Req {
        desc: false,
        alpha: false,
        limit: None,
        store: None,
        by: None,
        dontsort: false,
        gets: Vec::new(),
    };
    let full_access = c.user.all_keys_for(i, a);
    let mut j = 2;
    while j < a.len() {
        let left = a.len() - j - 1;
        let o = &a[j];
        if eq(o, "asc") {
            r.desc = false;
        } else if eq(o, "desc") {
            r.desc = true;
        } else if eq(o, "alpha") {
            r.alpha = true;
        } else if eq(o, "limit") && left >= 2 {
            let start = super::int_arg(&a[j + 1])?;
            let count = super::int_arg(&a[j + 2])?;
            r.limit = Some((start, count));
            j += 2;
        } else if !readonly && eq(o, "store") && left >= 1 {
            r.store = Some(a[j + 1].clone());
            j += 1;
        } else if eq(o, "by") && left >= 1 {
            let p = &a[j + 1];
            // Redis never clears the flag: a constant BY anywhere means no
            // sort.
            if !c_str(p).contains(&b'*') {
                r.dontsort = true;
            } else if !full_access {
                return Err(CmdError::SortPatternDenied("BY"));
            }
            r.by = Some(p.clone());
            j += 1;
        } else if eq(o, "get") && left >= 1 {
            if !full_access {
                return Err(CmdError::SortPatternDenied("GET"));
            }
            r.gets.push(a[j + 1].clone());
            j += 1;
        } else {
            return Err(CmdError::Syntax);
        }
        j += 1;
    }
    Ok(r)
}

/// The bytes C sees of a pattern: up to its first NUL.
fn c_str(p: &[u8]) -> &[u8] {
    p.split(|&b| b == 0).next().unwrap_or_default()
}

/// What a pattern names for one element (Redis's `lookupKeyByPattern`).
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// `#`: the element itself.
    Element,
    /// A string key, or a hash key's field.
    Key {
        key: Vec<u8>,
        field: Option<Vec<u8>>,
    },
    /// A pattern without `*`: nothing.
    Nothing,
}

fn target(pat: &[u8], elem: &[u8]) -> Target {
    if pat.first() == Some(&b'#') && pat.get(1).is_none_or(|&b| b == 0) {
        return Target::Element;
    }
    let cpat = c_str(pat);
    let Some(star) = cpat.iter().position(|&b| b == b'*') else {
        return Target::Nothing;
    };
    // A `->` after the star followed by at least one byte makes the rest a
    // hash field.
    let arrow = cpat[star + 1..]
        .windows(2)
        .position(|w| w == b"->")
        .map(|p| star + 1 + p)
        .filter(|&f| f + 2 < cpat.len());
    let (key_end, field) = match arrow {
        Some(f) => (f, Some(pat[f + 2..].to_vec())),
        None => (pat.len(), None),
    };
    let mut key = Vec::with_capacity(key_end + elem.len());
    key.extend_from_slice(&pat[..star]);
    key.extend_from_slice(elem);
    key.extend_from_slice(&pat[star + 1..key_end]);
    Target::Key { key, field }
}

/// The value `pat` names for `elem` (stripe locks of its key held): a
/// string's value or a hash field's; None for a missing key or field or a
/// key of another type.
fn lookup(ctx: &mut Ctx, db: u8, pat: &[u8], elem: &[u8]) -> Result<Option<Vec<u8>>, CmdError> {
    let (key, field) = match target(pat, elem) {
        Target::Element => return Ok(Some(elem.to_vec())),
        Target::Nothing => return Ok(None),
        Target::Key { key, field } => (key, field),
    };
    let sk = skey(db, &key);
    let Some(h) = ctx.ks.lookup_locked(&sk, ctx.now)? else {
        return Ok(None);
    };
    match (field, h.kind) {
        (None, KIND_STRING) => Ok(Some(ctx.ks.raw[h.off..].to_vec())),
        (Some(f), KIND_HASH) => {
            let head = MapHead::decode(&ctx.ks.raw[h.off..])?;
            maps::get(ctx, &head, &f)
        }
        _ => Ok(None),
    }
}

/// The elements to sort, in the collection's order, and its type (an
/// absent key sorts as an empty list).
fn elements(ctx: &mut Ctx, sk: &[u8]) -> Result<(u8, Vec<Vec<u8>>), CmdError> {
    let Some(h) = ctx.ks.lookup_locked(sk, ctx.now)? else {
        return Ok((KIND_LIST, Vec::new()));
    };
    Ok(match h.kind {
        KIND_LIST => (KIND_LIST, lists::items(ctx, sk)?.unwrap_or_default()),
        KIND_SET => {
            let m = maps::load(ctx, sk, KIND_SET)?;
            let items = match m {
                Some(m) => maps::all(ctx, &m.head)?
                    .into_iter()
                    .map(|(k, _)| k)
                    .collect(),
                None => Vec::new(),
            };
            (KIND_SET, items)
        }
        KIND_ZSET => {
            let items = match zsets::load(ctx, sk)? {
                Some(z) => zsets::all(ctx, &z.head)?
                    .into_iter()
                    .map(|e| e.bytes)
                    .collect(),
                None => Vec::new(),
            };
            (KIND_ZSET, items)
        }
        _ => return Err(CmdError::WrongType),
    })
}

/// A weight as SORT reads it (C's `strtod` on the whole string): leading
/// white space allowed, the empty string is 0, and a value out of range
/// (overflow, or underflow: C reports a decimal that rounds to a
/// subnormal as out of range) or NaN is an error.
fn weight(b: &[u8]) -> Option<f64> {
    let b = c_str(b);
    if b.is_empty() {
        return Some(0.0);
    }
    let skip = b
        .iter()
        .take_while(|&&c| matches!(c, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r'))
        .count();
    let rest = &b[skip..];
    let f = super::float_arg(rest)?;
    let body = rest
        .strip_prefix(b"-")
        .or(rest.strip_prefix(b"+"))
        .unwrap_or(rest);
    let hex = body.len() > 1 && body[..2].eq_ignore_ascii_case(b"0x");
    if f != 0.0 && f.abs() < f64::MIN_POSITIVE && !hex {
        return None;
    }
    Some(f)
}

/// One element being sorted.
struct Item {
    elem: Vec<u8>,
    score: f64,
    /// ALPHA's BY value (None: its key or field is missing).
    by: Option<Vec<u8>>,
}

/// Redis's `sortCompare` (ALPHA compares bytes, as Redis does under the C
/// locale).
fn compare(x: &Item, y: &Item, alpha: bool, by: bool) -> Ordering {
    if !alpha {
        if x.score > y.score {
            Ordering::Greater
        } else if x.score < y.score {
            Ordering::Less
        } else {
            x.elem.cmp(&y.elem)
        }
    } else if by {
        match (&x.by, &y.by) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(a), Some(b)) => a.cmp(b),
        }
    } else {
        x.elem.cmp(&y.elem)
    }
}

/// Redis's LIMIT normalisation: the first and last index (inclusive; last
/// below first when nothing is selected) among `len` elements.
fn window(limit: Option<(i64, i64)>, len: usize) -> (i64, i64) {
    let len = len as i64;
    let (start, count) = limit.unwrap_or((0, -1));
    let mut start = start.max(0).min(len);
    let count = count.max(-1).min(len);
    let mut end = if count < 0 {
        len - 1
    } else {
        start + count - 1
    };
    if start >= len {
        start = len - 1;
        end = len - 2;
    }
    if end >= len {
        end = len - 1;
    }
    (start, end)
}

/// What the sort produced.
enum Output {
    /// The reply: per selected element, the element or its GET values.
    Values(Vec<Option<Vec<u8>>>),
    Stored(i64),
}

/// The keys the patterns name for `elems` (store keys), beyond `#`.
fn pattern_keys(db: u8, req: &Req, elems: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut pats: Vec<&[u8]> = req.gets.iter().map(|p| p.as_slice()).collect();
    if let (Some(by), false) = (&req.by, req.dontsort) {
        pats.push(by);
    }
    let mut out = Vec::new();
    for p in pats {
        for e in elems {
            if let Target::Key { key, .. } = target(p, e) {
                out.push(skey(db, &key));
            }
        }
    }
    out
}

/// The sort itself, every key it reads locked: Err(keys) when the elements
/// name pattern keys not in `locked_keys`.
fn run(
    ctx: &mut Ctx,
    db: u8,
    req: &Req,
    src: &[u8],
    locked_keys: &BTreeSet<Vec<u8>>,
) -> Result<Result<Output, Vec<Vec<u8>>>, CmdError> {
    let (kind, elems) = elements(ctx, src)?;
    let missing: Vec<Vec<u8>> = pattern_keys(db, req, &elems)
        .into_iter()
        .filter(|k| !locked_keys.contains(k))
        .collect();
    if !missing.is_empty() {
        return Ok(Err(missing));
    }
    let (mut alpha, mut dontsort, mut by) = (req.alpha, req.dontsort, req.by.as_deref());
    // A set has no order of its own: stored (or scripted) results are
    // sorted as strings so that they are the same everywhere.
    if dontsort && kind == KIND_SET && req.store.is_some() {
        dontsort = false;
        alpha = true;
        by = None;
    }
    let len = elems.len();
    let (mut start, mut end) = window(req.limit, len);
    let mut items: Vec<Item>;
    if dontsort && (kind == KIND_LIST || kind == KIND_ZSET) {
        // The collection's own order, from the end for DESC, and only the
        // window.
        items = Vec::new();
        if end >= start {
            let take = (end - start + 1) as usize;
            let it: Box<dyn Iterator<Item = Vec<u8>>> = if req.desc {
                Box::new(elems.into_iter().rev())
            } else {
                Box::new(elems.into_iter())
            };
            items = it
                .skip(start as usize)
                .take(take)
                .map(|elem| Item {
                    elem,
                    score: 0.0,
                    by: None,
                })
                .collect();
            end -= start;
            start = 0;
        }
    } else {
        items = elems
            .into_iter()
            .map(|elem| Item {
                elem,
                score: 0.0,
                by: None,
            })
            .collect();
    }
    let mut bad_weight = false;
    if !dontsort {
        for it in &mut items {
            let w = match by {
                Some(p) => match lookup(ctx, db, p, &it.elem)? {
                    Some(v) => v,
                    None => continue,
                },
                None => it.elem.clone(),
            };
            if alpha {
                if by.is_some() {
                    it.by = Some(w);
                }
            } else {
                match weight(&w) {
                    Some(s) => it.score = s,
                    None => bad_weight = true,
                }
            }
        }
        let has_by = by.is_some();
        let cmp = |x: &Item, y: &Item| {
            let o = compare(x, y, alpha, has_by);
            if req.desc {
                o.reverse()
            } else {
                o
            }
        };
        let whole = start == 0 && end == len as i64 - 1;
        if has_by && !whole && end >= start {
            // Redis's partial quicksort for a window of BY weights: equal
            // weights end up in its order.
            pqsort(&mut items, start as usize, end as usize, cmp);
        } else {
            // A stable sort, as the C library's qsort (a merge sort): equal
            // items keep the collection's order.
            items.sort_by(cmp);
        }
    }
    if bad_weight {
        return Err(CmdError::Msg(
            "One or more scores can't be converted into double",
        ));
    }
    let mut values = Vec::new();
    if end >= start {
        for it in &items[start as usize..=end as usize] {
            if req.gets.is_empty() {
                values.push(Some(it.elem.clone()));
            }
            for g in &req.gets {
                values.push(lookup(ctx, db, g, &it.elem)?);
            }
        }
    }
    let Some(dst) = &req.store else {
        return Ok(Ok(Output::Values(values)));
    };
    let n = values.len() as i64;
    // A missing GET value is stored as an empty string.
    let list = values.into_iter().map(Option::unwrap_or_default).collect();
    let existed = lists::store(ctx, &skey(db, dst), list)?;
    if n > 0 {
        crate::notify::event(ctx, crate::notify::LIST, "sortstore", db, dst);
    } else if existed {
        crate::notify::event(ctx, crate::notify::GENERIC, "del", db, dst);
    }
    Ok(Ok(Output::Stored(n)))
}

fn sort_generic(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], readonly: bool) -> R {
    let i = super::lookup(&a[0]).unwrap_or(0);
    let req = parse(c, a, i, readonly)?;
    let db = c.db;
    let src = skey(db, &a[1]);
    let mut keys: BTreeSet<Vec<u8>> = BTreeSet::new();
    keys.insert(src.clone());
    if let Some(d) = &req.store {
        keys.insert(skey(db, d));
    }
    let out = loop {
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let r = super::locked(ctx, &refs, |ctx| run(ctx, db, &req, &src, &keys))?;
        match r {
            Ok(out) => break out,
            Err(more) => keys.extend(more),
        }
    };
    match out {
        Output::Stored(n) => c.int(n),
        Output::Values(vs) => {
            c.array_header(vs.len());
            for v in vs {
                match v {
                    Some(v) => c.bulk(&v),
                    None => c.null(),
                }
            }
        }
    }
    Ok(())
}

/// SORT key [BY pattern] [LIMIT offset count] [GET pattern ...] [ASC|DESC]
/// [ALPHA] [STORE destination]
pub fn sort(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    sort_generic(ctx, c, a, false)
}

/// SORT_RO: SORT without STORE.
pub fn sort_ro(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    sort_generic(ctx, c, a, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &[u8], f: Option<&[u8]>) -> Target {
        Target::Key {
            key: k.to_vec(),
            field: f.map(|f| f.to_vec()),
        }
    }

    #[test]
    fn patterns_name_keys_as_redis() {
        assert_eq!(target(b"#", b"x"), Target::Element);
        assert_eq!(target(b"w_*", b"x"), key(b"w_x", None));
        assert_eq!(target(b"w_*_z*", b"x"), key(b"w_x_z*", None));
        assert_eq!(target(b"h_*->f", b"x"), key(b"h_x", Some(b"f")));
        assert_eq!(target(b"h_*->f->g", b"x"), key(b"h_x", Some(b"f->g")));
        // An arrow with nothing after it is part of the key.
        assert_eq!(target(b"h_*->", b"x"), key(b"h_x->", None));
        // An arrow before the star does not count.
        assert_eq!(target(b"a->b*", b"x"), key(b"a->bx", None));
        assert_eq!(target(b"nostar", b"x"), Target::Nothing);
        assert_eq!(target(b"##", b"x"), Target::Nothing);
    }

    #[test]
    fn weights_parse_as_strtod() {
        assert_eq!(weight(b""), Some(0.0));
        assert_eq!(weight(b" 12"), Some(12.0));
        assert_eq!(weight(b"1.5e3"), Some(1500.0));
        assert_eq!(weight(b"0x10"), Some(16.0));
        assert_eq!(weight(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(weight(b"   "), None);
        assert_eq!(weight(b"12 "), None);
        assert_eq!(weight(b"nan"), None);
        assert_eq!(weight(b"1e400"), None);
        assert_eq!(weight(b"1e-400"), None);
        assert_eq!(weight(b"1e-310"), None);
        assert_eq!(weight(b"abc"), None);
    }

    #[test]
    fn limits_normalise_as_redis() {
        assert_eq!(window(None, 5), (0, 4));
        assert_eq!(window(Some((1, 2)), 5), (1, 2));
        assert_eq!(window(Some((-3, 2)), 5), (0, 1));
        assert_eq!(window(Some((2, -5)), 5), (2, 4));
        assert_eq!(window(Some((7, 1)), 5), (4, 3));
        assert_eq!(window(Some((0, 0)), 5), (0, -1));
        assert_eq!(window(None, 0), (-1, -2));
    }
}
