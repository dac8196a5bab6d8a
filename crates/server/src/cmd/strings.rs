//! String and counter commands.

use super::{eq, int_arg, locked, CmdError, Ctx, R};
use crate::keyspace::{skey, Header, KIND_STRING};
use crate::notify::{self, event};
use crate::server::Client;

/// Largest string (Redis's `proto-max-bulk-len` default).
const MAX_STRING: i64 = 512 * 1024 * 1024;

/// Reads a string for a reader (no lock); errors on another type.
fn read_string(ctx: &mut Ctx, c: &Client, key: &[u8]) -> Result<Option<Header>, CmdError> {
    let f = ctx.ks.get(&ctx.sh.stripes, c.db, key, ctx.now)?;
    match f {
        Some(h) if h.kind != KIND_STRING => Err(CmdError::WrongType),
        f => Ok(f),
    }
}

pub fn get(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    match read_string(ctx, c, &a[1])? {
        Some(h) => {
            ctx.ws.hits.add(1);
            c.bulk(&ctx.ks.raw[h.off..]);
        }
        None => {
            ctx.ws.misses.add(1);
            c.null();
        }
    }
    Ok(())
}

/// SET's and GETEX's options, parsed as Redis's
/// `parseExtendedStringArgumentsOrReply` does: NX/XX exclude each other,
/// KEEPTTL (SET) and PERSIST (GETEX) exclude every expiry option, and the four
/// expiry options exclude each other but not themselves (`EX 1 EX 2` is
/// accepted; the last value counts). Values are checked later, by the caller.
#[derive(Default)]
struct ExtArgs<'a> {
    nx: bool,
    xx: bool,
    get: bool,
    keepttl: bool,
    persist: bool,
    /// The expiry option's value: (value, in ms?, relative?).
    expire: Option<(&'a [u8], bool, bool)>,
}

fn parse_ext(a: &[Vec<u8>], start: usize, set: bool) -> Result<ExtArgs<'_>, CmdError> {
    let mut o = ExtArgs::default();
    let mut kind: Option<&'static str> = None;
    let mut j = start;
    while j < a.len() {
        let opt = &a[j];
        let next = a.get(j + 1);
        let exp_kind = ["ex", "px", "exat", "pxat"]
            .into_iter()
            .find(|k| eq(opt, k));
        if set && eq(opt, "nx") && !o.xx {
            o.nx = true;
        } else if set && eq(opt, "xx") && !o.nx {
            o.xx = true;
        } else if set && eq(opt, "get") {
            o.get = true;
        } else if set && eq(opt, "keepttl") && kind.is_none() {
            o.keepttl = true;
        } else if !set && eq(opt, "persist") && kind.is_none() {
            o.persist = true;
        } else if let (Some(k), Some(v)) = (exp_kind, next) {
            if o.keepttl || o.persist || kind.is_some_and(|x| x != k) {
                return Err(CmdError::Syntax);
            }
            kind = Some(k);
            o.expire = Some((v, k.starts_with('p'), k.len() == 2));
            j += 1;
        } else {
            return Err(CmdError::Syntax);
        }
        j += 1;
    }
    Ok(o)
}

/// Converts an expire argument to absolute ms, Redis's checks and wording.
pub fn expire_at(
    ctx: &Ctx,
    v: &[u8],
    unit_ms: bool,
    relative: bool,
    cmd: &'static str,
) -> Result<i64, CmdError> {
    let n = int_arg(v)?;
    let invalid = || CmdError::InvalidExpire(cmd);
    if n <= 0 {
        return Err(invalid());
    }
    let ms = if unit_ms {
        n
    } else {
        n.checked_mul(1000).ok_or_else(invalid)?
    };
    if relative {
        ms.checked_add(ctx.now).ok_or_else(invalid)
    } else {
        Ok(ms)
    }
}

/// Writes a string under the caller's lock; a past expiry deletes the key.
pub(super) fn store(ctx: &mut Ctx, sk: &[u8], expire: Option<i64>, v: &[u8]) -> R {
    if v.len() as i64 > MAX_STRING {
        return Err(CmdError::StringTooLong);
    }
    if let Some(t) = expire {
        if t <= ctx.now {
            ctx.ks.delete(sk, ctx.now)?;
            return Ok(());
        }
    }
    // A collection it replaces leaves no pieces behind (a store where no
    // collection ever had pieces needs no look).
    if ctx.sh.pieced.load(std::sync::atomic::Ordering::Relaxed) {
        ctx.ks.free_pieces(sk, ctx.now)?;
    }
    ctx.ks.put(sk, KIND_STRING, expire, v);
    Ok(())
}

pub fn set(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let o = parse_ext(a, 3, true)?;
    let at = match o.expire {
        Some((v, ms, rel)) => Some(expire_at(ctx, v, ms, rel, "set")?),
        None => None,
    };
    let (nx, xx, get) = (o.nx, o.xx, o.get);
    let sk = skey(c.db, &a[1]);
    let db = c.db;
    let wrote = locked(ctx, &[&sk], |ctx| {
        let need_old = nx || xx || get || o.keepttl;
        let old = if need_old {
            ctx.ks.lookup_locked(&sk, ctx.now)?
        } else {
            None
        };
        let old_val = match (get, old) {
            (true, Some(h)) if h.kind != KIND_STRING => return Err(CmdError::WrongType),
            (true, Some(h)) => Some(ctx.ks.raw[h.off..].to_vec()),
            _ => None,
        };
        let skip = (nx && old.is_some()) || (xx && old.is_none());
        if !skip {
            let expire = match at {
                Some(t) => Some(t),
                None if o.keepttl => old.and_then(|h| h.expire),
                None => None,
            };
            store(ctx, &sk, expire, &a[2])?;
        }
        if get {
            match old_val {
                Some(v) => c.bulk(&v),
                None => c.null(),
            }
        } else if skip {
            c.null();
        } else {
            c.ok();
        }
        Ok(!skip)
    })?;
    if wrote {
        set_events(ctx, db, &a[1], at);
    }
    Ok(())
}

/// The events of a SET-like write: `set`, then `expire` when it set a TTL
/// (and `expired` when that time had passed: Ember removes such a key at
/// once, where Redis expires it at its next look).
fn set_events(ctx: &mut Ctx, db: u8, key: &[u8], at: Option<i64>) {
    event(ctx, notify::STRING, "set", db, key);
    if let Some(t) = at {
        event(ctx, notify::GENERIC, "expire", db, key);
        if t <= ctx.now {
            event(ctx, notify::EXPIRED, "expired", db, key);
        }
    }
}

pub fn setnx(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[1]);
    let wrote = locked(ctx, &[&sk], |ctx| {
        if ctx.ks.lookup_locked(&sk, ctx.now)?.is_some() {
            c.int(0);
            Ok(false)
        } else {
            store(ctx, &sk, None, &a[2])?;
            c.int(1);
            Ok(true)
        }
    })?;
    if wrote {
        event(ctx, notify::STRING, "set", c.db, &a[1]);
    }
    Ok(())
}

fn setex_generic(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], ms: bool, cmd: &'static str) -> R {
    let t = expire_at(ctx, &a[2], ms, true, cmd)?;
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        store(ctx, &sk, Some(t), &a[3])?;
        c.ok();
        Ok(())
    })?;
    set_events(ctx, c.db, &a[1], Some(t));
    Ok(())
}

pub fn setex(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    setex_generic(ctx, c, a, false, "setex")
}

pub fn psetex(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    setex_generic(ctx, c, a, true, "psetex")
}

pub fn getset(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let old = match ctx.ks.lookup_locked(&sk, ctx.now)? {
            Some(h) if h.kind != KIND_STRING => return Err(CmdError::WrongType),
            Some(h) => Some(ctx.ks.raw[h.off..].to_vec()),
            None => None,
        };
        store(ctx, &sk, None, &a[2])?;
        match old {
            Some(v) => c.bulk(&v),
            None => c.null(),
        }
        Ok(())
    })?;
    event(ctx, notify::STRING, "set", c.db, &a[1]);
    Ok(())
}

pub fn getdel(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[1]);
    let deleted = locked(ctx, &[&sk], |ctx| {
        match ctx.ks.lookup_locked(&sk, ctx.now)? {
            Some(h) if h.kind != KIND_STRING => Err(CmdError::WrongType),
            Some(h) => {
                let v = ctx.ks.raw[h.off..].to_vec();
                ctx.ks.delete(&sk, ctx.now)?;
                c.bulk(&v);
                Ok(true)
            }
            None => {
                c.null();
                Ok(false)
            }
        }
    })?;
    if deleted {
        event(ctx, notify::GENERIC, "del", c.db, &a[1]);
    }
    Ok(())
}

pub fn getex(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    // As in Redis: the options' syntax first, the key next, the expiry value
    // last (GETEX on a missing key answers nil even with a bad time).
    let o = parse_ext(a, 2, false)?;
    let sk = skey(c.db, &a[1]);
    let what = locked(ctx, &[&sk], |ctx| {
        let Some(h) = ctx.ks.lookup_locked(&sk, ctx.now)? else {
            c.null();
            return Ok(None);
        };
        if h.kind != KIND_STRING {
            return Err(CmdError::WrongType);
        }
        let at = match o.expire {
            Some((v, ms, rel)) => Some(expire_at(ctx, v, ms, rel, "getex")?),
            None => None,
        };
        let v = ctx.ks.raw[h.off..].to_vec();
        let what = match at {
            Some(t) => {
                store(ctx, &sk, Some(t), &v)?;
                Some(if t <= ctx.now { "del" } else { "expire" })
            }
            None if o.persist && h.expire.is_some() => {
                store(ctx, &sk, None, &v)?;
                Some("persist")
            }
            None => None,
        };
        c.bulk(&v);
        Ok(what)
    })?;
    if let Some(name) = what {
        event(ctx, notify::GENERIC, name, c.db, &a[1]);
    }
    Ok(())
}

pub fn mget(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if a.len() == 2 {
        c.array_header(1);
        match ctx.ks.get(&ctx.sh.stripes, c.db, &a[1], ctx.now)? {
            Some(h) if h.kind == KIND_STRING => c.bulk(&ctx.ks.raw[h.off..]),
            _ => c.null(),
        }
        return Ok(());
    }
    // Several keys: read under their stripe locks, so that a batch another
    // worker applies under them (MSET, a transaction, a script) is seen
    // whole or not at all, as Redis's MGET sees it.
    let sks: Vec<Vec<u8>> = a[1..].iter().map(|k| skey(c.db, k)).collect();
    let refs: Vec<&[u8]> = sks.iter().map(|k| k.as_slice()).collect();
    locked(ctx, &refs, |ctx| {
        c.array_header(sks.len());
        for sk in &sks {
            match ctx.ks.lookup_locked(sk, ctx.now)? {
                Some(h) if h.kind == KIND_STRING => c.bulk(&ctx.ks.raw[h.off..]),
                _ => c.null(),
            }
        }
        Ok(())
    })
}

fn mset_generic(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], nx: bool) -> R {
    if a.len() & 1 == 0 {
        return Err(super::arity_error(if nx { "msetnx" } else { "mset" }));
    }
    let sks: Vec<Vec<u8>> = a[1..].chunks(2).map(|p| skey(c.db, &p[0])).collect();
    let refs: Vec<&[u8]> = sks.iter().map(|k| k.as_slice()).collect();
    let wrote = locked(ctx, &refs, |ctx| {
        if nx {
            for sk in &sks {
                if ctx.ks.lookup_locked(sk, ctx.now)?.is_some() {
                    c.int(0);
                    return Ok(false);
                }
            }
        }
        for (sk, p) in sks.iter().zip(a[1..].chunks(2)) {
            store(ctx, sk, None, &p[1])?;
        }
        if nx {
            c.int(1);
        } else {
            c.ok();
        }
        Ok(true)
    })?;
    if wrote {
        for p in a[1..].chunks(2) {
            event(ctx, notify::STRING, "set", c.db, &p[0]);
        }
    }
    Ok(())
}

pub fn mset(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    mset_generic(ctx, c, a, false)
}

pub fn msetnx(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    mset_generic(ctx, c, a, true)
}

/// Read-modify-write of a string under the key's lock: `f` gets the current
/// value (None when absent) and returns the new one; the TTL is kept.
fn modify(
    ctx: &mut Ctx,
    c: &Client,
    key: &[u8],
    f: impl FnOnce(Option<&[u8]>) -> Result<Option<Vec<u8>>, CmdError>,
) -> Result<Option<usize>, CmdError> {
    let sk = skey(c.db, key);
    locked(ctx, &[&sk], |ctx| {
        let h = ctx.ks.lookup_locked(&sk, ctx.now)?;
        if let Some(h) = h {
            if h.kind != KIND_STRING {
                return Err(CmdError::WrongType);
            }
        }
        let cur = h.map(|h| &ctx.ks.raw[h.off..]);
        let Some(new) = f(cur)? else {
            return Ok(cur.map(|v| v.len()));
        };
        let len = new.len();
        store(ctx, &sk, h.and_then(|h| h.expire), &new)?;
        Ok(Some(len))
    })
}

/// Redis's `checkStringLength`: a string of `len` bytes is refused above
/// `proto-max-bulk-len` (checked after the key's type, as Redis does).
fn check_length(limit: u64, len: u64) -> Result<(), CmdError> {
    if len > limit {
        return Err(CmdError::StringTooLong);
    }
    Ok(())
}

pub fn append(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let add = &a[2];
    let limit = ctx.sh.cfg().proto_max_bulk_len;
    let n = modify(ctx, c, &a[1], |cur| {
        // A new key takes the argument as it is (the protocol bounded it).
        if let Some(cur) = cur {
            check_length(limit, (cur.len() + add.len()) as u64)?;
        }
        let cur = cur.unwrap_or_default();
        let mut v = Vec::with_capacity(cur.len() + add.len());
        v.extend_from_slice(cur);
        v.extend_from_slice(add);
        Ok(Some(v))
    })?;
    c.int(n.unwrap_or(0) as i64);
    event(ctx, notify::STRING, "append", c.db, &a[1]);
    Ok(())
}

pub fn strlen(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let n = read_string(ctx, c, &a[1])?.map_or(0, |h| ctx.ks.raw.len() - h.off);
    c.int(n as i64);
    Ok(())
}

pub fn getrange(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let mut start = int_arg(&a[2])?;
    let mut end = int_arg(&a[3])?;
    let Some(h) = read_string(ctx, c, &a[1])? else {
        c.bulk(b"");
        return Ok(());
    };
    let v = &ctx.ks.raw[h.off..];
    let len = v.len() as i64;
    if start < 0 && end < 0 && start > end {
        c.bulk(b"");
        return Ok(());
    }
    if start < 0 {
        start += len;
    }
    if end < 0 {
        end += len;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= len {
        end = len - 1;
    }
    if start > end || len == 0 {
        c.bulk(b"");
    } else {
        let s = v[start as usize..=end as usize].to_vec();
        c.bulk(&s);
    }
    Ok(())
}

pub fn setrange(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let off = int_arg(&a[2])?;
    if off < 0 {
        return Err(CmdError::OffsetOutOfRange);
    }
    let val = &a[3];
    let limit = ctx.sh.cfg().proto_max_bulk_len;
    let n = modify(ctx, c, &a[1], |cur| {
        if val.is_empty() {
            return Ok(None);
        }
        check_length(limit, (off as u64).saturating_add(val.len() as u64))?;
        let cur = cur.unwrap_or_default();
        let off = off as usize;
        let mut v = cur.to_vec();
        if v.len() < off + val.len() {
            v.resize(off + val.len(), 0);
        }
        v[off..off + val.len()].copy_from_slice(val);
        Ok(Some(v))
    })?;
    c.int(n.unwrap_or(0) as i64);
    if !val.is_empty() {
        event(ctx, notify::STRING, "setrange", c.db, &a[1]);
    }
    Ok(())
}

fn incr_generic(ctx: &mut Ctx, c: &mut Client, key: &[u8], by: i64) -> R {
    let mut result = 0;
    modify(ctx, c, key, |cur| {
        let base = match cur {
            None => 0,
            Some(v) => proto::int::parse_i64(v).ok_or(CmdError::NotInteger)?,
        };
        result = base.checked_add(by).ok_or(CmdError::IncrOverflow)?;
        Ok(Some(result.to_string().into_bytes()))
    })?;
    c.int(result);
    event(ctx, notify::STRING, "incrby", c.db, key);
    Ok(())
}

pub fn incr(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    incr_generic(ctx, c, &a[1], 1)
}

pub fn decr(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    incr_generic(ctx, c, &a[1], -1)
}

pub fn incrby(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let by = int_arg(&a[2])?;
    incr_generic(ctx, c, &a[1], by)
}

pub fn decrby(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let by = int_arg(&a[2])?;
    if by == i64::MIN {
        return Err(CmdError::DecrOverflow);
    }
    incr_generic(ctx, c, &a[1], -by)
}

/// C's `isspace`.
fn c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Parses a float as Redis's `string2ld` accepts it (`strtold` on the whole
/// argument): no leading or trailing space, no NaN, decimal or C99 hex
/// (`0x1.8p3`) notation, `inf`/`infinity`; out of range (`1e5000`, `1e-5000`)
/// is refused like `strtold`'s `ERANGE`. The value is an `f64`, so values
/// that only a long double holds (about 1e309..1e4932) are refused too.
pub(crate) fn float_arg(v: &[u8]) -> Option<f64> {
    if v.is_empty() || v.len() >= 5120 || c_space(v[0]) {
        return None;
    }
    let s = std::str::from_utf8(v).ok()?;
    let (neg, body) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let hex = body.len() > 2 && body.as_bytes()[..2].eq_ignore_ascii_case(b"0x");
    let f = if hex {
        let m = hex_float(&body[2..])?;
        if neg {
            -m
        } else {
            m
        }
    } else {
        s.parse::<f64>().ok()?
    };
    if f.is_nan() {
        return None;
    }
    let word = body.to_ascii_lowercase();
    if f.is_infinite() && word != "inf" && word != "infinity" {
        return None; // overflow (ERANGE, HUGE_VAL)
    }
    if f == 0.0 {
        // Underflow to zero (ERANGE): a nonzero digit before the exponent.
        let mantissa = if hex {
            body[2..].split(['p', 'P']).next()
        } else {
            body.split(['e', 'E']).next()
        };
        if mantissa.is_some_and(|m| m.bytes().any(|b| b.is_ascii_alphanumeric() && b != b'0')) {
            return None;
        }
    }
    Some(f)
}

/// The part of a hex float after `0x`: hex digits with an optional point, at
/// least one digit, then an optional binary exponent `p[+-]digits`.
fn hex_float(s: &str) -> Option<f64> {
    let (mant, exp) = match s.find(['p', 'P']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let mut m: u64 = 0;
    let mut shift: i64 = 0;
    for (i, ch) in int.chars().chain(frac.chars()).enumerate() {
        let d = ch.to_digit(16)? as u64;
        if m >> 60 == 0 {
            m = m * 16 + d;
            if i >= int.len() {
                shift -= 4;
            }
        } else if i < int.len() {
            shift += 4; // digits past 64 bits of precision
        }
    }
    let mut e: i64 = match exp {
        None => 0,
        Some(x) => {
            let digits = x.strip_prefix(['+', '-']).unwrap_or(x);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: i64 = digits.parse().unwrap_or(i64::MAX / 4).min(100_000);
            if x.starts_with('-') {
                -n
            } else {
                n
            }
        }
    };
    e += shift;
    let mut f = m as f64;
    while e > 0 && f.is_finite() && f != 0.0 {
        let step = e.min(1000);
        f *= 2f64.powi(step as i32);
        e -= step;
    }
    while e < 0 && f != 0.0 {
        let step = (-e).min(1000);
        f /= 2f64.powi(step as i32);
        e += step;
    }
    Some(f)
}

/// Formats the result like Redis's `ld2string` in human mode (`%.17Lf`,
/// trailing zeros and point dropped, "-0" as "0"), from an `f64`: integers
/// from 2^53 up are printed exactly, other values with their shortest
/// round-trip digits, rounded to 17 decimals when they have more. Redis
/// computes in `long double`, so results that are not exact in binary can
/// differ in the last digits (0.1 + 0.2: Redis "0.3", Ember
/// "0.30000000000000004"); shortest digits make typical decimal sums agree
/// (10.5 + 0.1 is "10.6" in both), and exact binary sums always agree.
pub(crate) fn format_incr_float(f: f64) -> String {
    let mut s = if f.abs() >= 9007199254740992.0 {
        format!("{f:.0}")
    } else {
        let short = format!("{f}");
        match short.split_once('.') {
            Some((_, frac)) if frac.len() > 17 => format!("{f:.17}"),
            _ => short,
        }
    };
    if s.contains('.') {
        let keep = s.trim_end_matches('0').trim_end_matches('.').len();
        s.truncate(keep);
    }
    if s == "-0" {
        s = "0".into();
    }
    s
}

pub fn incrbyfloat(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let by = float_arg(&a[2]).ok_or(CmdError::NotFloat)?;
    let mut out = String::new();
    modify(ctx, c, &a[1], |cur| {
        let base = match cur {
            None => 0.0,
            Some(v) => float_arg(v).ok_or(CmdError::NotFloat)?,
        };
        let r = base + by;
        if !r.is_finite() {
            return Err(CmdError::NanOrInfinity);
        }
        out = format_incr_float(r);
        Ok(Some(out.clone().into_bytes()))
    })?;
    c.bulk(out.as_bytes());
    event(ctx, notify::STRING, "incrbyfloat", c.db, &a[1]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_format_like_redis() {
        assert_eq!(format_incr_float(10.6), "10.6");
        assert_eq!(format_incr_float(3.0), "3");
        assert_eq!(format_incr_float(-0.0), "0");
        assert_eq!(format_incr_float(5.0e3), "5000");
        assert_eq!(format_incr_float(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(format_incr_float(1e-20), "0");
        assert_eq!(format_incr_float(-1e-20), "0");
        assert_eq!(format_incr_float(2f64.powi(70)), "1180591620717411303424");
        assert_eq!(format_incr_float(-2.25), "-2.25");
        assert_eq!(format_incr_float(10.5 + 0.1), "10.6");
        assert_eq!(format_incr_float(5e-18), "0.00000000000000001");
        assert_eq!(format_incr_float(2f64.powi(60)), "1152921504606846976");
        assert_eq!(format_incr_float(-(2f64.powi(53))), "-9007199254740992");
        assert_eq!(format_incr_float(1e300).len(), 301);
        assert_eq!(float_arg(b" 1"), None);
        assert_eq!(float_arg(b"1 "), None);
        assert_eq!(float_arg(b"\x0b1"), None);
        assert_eq!(float_arg(b"nan"), None);
        assert_eq!(float_arg(b"1e3"), Some(1000.0));
        assert_eq!(float_arg(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(float_arg(b"Infinity"), Some(f64::INFINITY));
        assert_eq!(float_arg(b"1e5000"), None);
        assert_eq!(float_arg(b"-1e-5000"), None);
        assert_eq!(float_arg(b"0e-5000"), Some(0.0));
        assert_eq!(float_arg(b"0x10"), Some(16.0));
        assert_eq!(float_arg(b"-0x.8"), Some(-0.5));
        assert_eq!(float_arg(b"0x1p-2"), Some(0.25));
        assert_eq!(float_arg(b"0X1.8P+1"), Some(3.0));
        assert_eq!(float_arg(b"0x"), None);
        assert_eq!(float_arg(b"0x1p"), None);
        assert_eq!(float_arg(b"0xg"), None);
        assert_eq!(float_arg(&[b'1'; 5120]), None);
        assert_eq!(float_arg("€1".as_bytes()), None);
        assert_eq!(float_arg("-€1".as_bytes()), None);
        assert_eq!(float_arg("0x€".as_bytes()), None);
        // No input makes the parser panic.
        let atoms: [&str; 12] = ["0", "x", "X", ".", "p", "-", "+", "e", "1", "€", "é", " "];
        for n in 0..atoms.len().pow(4) {
            let mut s = String::new();
            let mut k = n;
            for _ in 0..4 {
                s.push_str(atoms[k % atoms.len()]);
                k /= atoms.len();
            }
            let _ = float_arg(s.as_bytes());
        }
    }
}
