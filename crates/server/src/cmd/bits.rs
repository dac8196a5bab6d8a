//! Bitmap commands on string values (Redis 7.0's `bitops.c` semantics):
//! SETBIT, GETBIT, BITCOUNT, BITPOS, BITOP, BITFIELD, BITFIELD_RO.
//!
//! Bit 0 is the most significant bit of the first byte. A write grows the
//! string with zero bytes up to the bit it touches; offsets are limited to
//! `proto-max-bulk-len` bytes as in Redis. Reads take no lock; writes read
//! and stage under the key's stripe lock ([`super::locked`]), keeping the TTL
//! (BITOP's destination is replaced, as SET does).

use super::{eq, int_arg, locked, CmdError, Ctx, R};
use crate::keyspace::{skey, KIND_STRING};
use crate::server::Client;

/// `proto-max-bulk-len`: bit offsets address at most this many bytes.
fn max_bytes(ctx: &Ctx) -> u64 {
    ctx.sh.cfg().proto_max_bulk_len
}

/// Parses a bit offset (Redis's `getBitOffsetFromArgument`). With `hash`
/// (BITFIELD), `#n` means `n * hash` bits.
fn bit_offset(a: &[u8], hash: Option<u32>, max: u64) -> Result<u64, CmdError> {
    let (digits, mul) = match hash {
        Some(bits) if a.first() == Some(&b'#') => (&a[1..], i64::from(bits)),
        _ => (a, 1),
    };
    let n = proto::int::parse_i64(digits)
        .ok_or(CmdError::BitOffset)?
        .wrapping_mul(mul);
    if n < 0 || (n as u64 >> 3) >= max {
        return Err(CmdError::BitOffset);
    }
    Ok(n as u64)
}

/// The payload offset in `ctx.ks.raw` of the string at `key` for a reader
/// (no lock): None when absent, WRONGTYPE for another type.
fn read_at(ctx: &mut Ctx, c: &Client, key: &[u8]) -> Result<Option<usize>, CmdError> {
    match ctx.ks.get(&ctx.sh.stripes, c.db, key, ctx.now)? {
        Some(h) if h.kind != KIND_STRING => Err(CmdError::WrongType),
        Some(h) => Ok(Some(h.off)),
        None => Ok(None),
    }
}

/// Read-modify-write of the string at `key` under its lock: `f` gets the
/// bytes (None when absent) and returns the new bytes to store (None: leave
/// the key alone) and its result. The TTL is kept.
fn rewrite<T>(
    ctx: &mut Ctx,
    c: &Client,
    key: &[u8],
    f: impl FnOnce(Option<&[u8]>) -> Result<(Option<Vec<u8>>, T), CmdError>,
) -> Result<T, CmdError> {
    let sk = skey(c.db, key);
    locked(ctx, &[&sk], |ctx| {
        let h = ctx.ks.lookup_locked(&sk, ctx.now)?;
        if h.is_some_and(|h| h.kind != KIND_STRING) {
            return Err(CmdError::WrongType);
        }
        let cur = h.map(|h| &ctx.ks.raw[h.off..]);
        let (new, out) = f(cur)?;
        if let Some(new) = new {
            ctx.ks.put(&sk, KIND_STRING, h.and_then(|h| h.expire), &new);
        }
        Ok(out)
    })
}

/// The bytes of `cur` grown with zeros to hold byte `byte`.
fn grown(cur: Option<&[u8]>, byte: u64) -> Vec<u8> {
    let mut v = cur.unwrap_or_default().to_vec();
    let need = byte as usize + 1;
    if v.len() < need {
        v.resize(need, 0);
    }
    v
}

pub fn setbit(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let off = bit_offset(&a[2], None, max_bytes(ctx))?;
    let on = int_arg(&a[3]).map_err(|_| CmdError::BitValue)?;
    if on & !1 != 0 {
        return Err(CmdError::BitValue);
    }
    let (old, wrote) = rewrite(ctx, c, &a[1], |cur| {
        let byte = (off >> 3) as usize;
        let mask = 1u8 << (7 - (off & 7));
        let old = cur.and_then(|v| v.get(byte)).is_some_and(|b| b & mask != 0);
        let grows = cur.is_none_or(|v| v.len() <= byte);
        if !grows && old == (on == 1) {
            return Ok((None, (old, false)));
        }
        let mut v = grown(cur, off >> 3);
        if on == 1 {
            v[byte] |= mask;
        } else {
            v[byte] &= !mask;
        }
        Ok((Some(v), (old, true)))
    })?;
    // Redis publishes `setbit` when the key was created, grew or changed.
    if wrote {
        crate::notify::event(ctx, crate::notify::STRING, "setbit", c.db, &a[1]);
    }
    c.int(i64::from(old));
    Ok(())
}

pub fn getbit(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let off = bit_offset(&a[2], None, max_bytes(ctx))?;
    let bit = match read_at(ctx, c, &a[1])? {
        Some(o) => ctx.ks.raw[o..]
            .get((off >> 3) as usize)
            .is_some_and(|b| b & (1 << (7 - (off & 7))) != 0),
        None => false,
    };
    c.int(i64::from(bit));
    Ok(())
}

/// A range argument as BITCOUNT and BITPOS resolve it: `start..=end` in
/// bytes, with masks of the bits outside a BIT range in its first and last
/// bytes; None when the range is empty.
struct Range {
    start: usize,
    end: usize,
    first_mask: u8,
    last_mask: u8,
}

/// Redis's range arithmetic: negative indexes from the end, clamped, and
/// in BIT mode converted to bytes with edge masks.
fn resolve(mut start: i64, mut end: i64, len: usize, isbit: bool) -> Option<Range> {
    let mut total = len as i64;
    if isbit {
        total <<= 3;
    }
    if start < 0 {
        start += total;
    }
    if end < 0 {
        end += total;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= total {
        end = total - 1;
    }
    let (mut first_mask, mut last_mask) = (0u8, 0u8);
    if isbit && start <= end {
        first_mask = !((1u16 << (8 - (start & 7))) - 1) as u8;
        last_mask = ((1u16 << (7 - (end & 7))) - 1) as u8;
        start >>= 3;
        end >>= 3;
    }
    (start <= end).then_some(Range {
        start: start as usize,
        end: end as usize,
        first_mask,
        last_mask,
    })
}

/// BIT or BYTE (any case); anything else is a syntax error.
fn unit(a: &[u8]) -> Result<bool, CmdError> {
    if eq(a, "bit") {
        Ok(true)
    } else if eq(a, "byte") {
        Ok(false)
    } else {
        Err(CmdError::Syntax)
    }
}

fn popcount(b: &[u8]) -> u64 {
    let mut words = b.chunks_exact(8);
    let mut n: u64 = words
        .by_ref()
        .map(|w| u64::from(u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])).count_ones()))
        .sum();
    n += words
        .remainder()
        .iter()
        .map(|x| u64::from(x.count_ones()))
        .sum::<u64>();
    n
}

pub fn bitcount(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    // As Redis: the key first (absent: 0 whatever the arguments), then them.
    let Some(o) = read_at(ctx, c, &a[1])? else {
        c.int(0);
        return Ok(());
    };
    let len = ctx.ks.raw.len() - o;
    let range = match a.len() {
        4 | 5 => {
            let start = int_arg(&a[2])?;
            let end = int_arg(&a[3])?;
            if start < 0 && end < 0 && start > end {
                c.int(0);
                return Ok(());
            }
            let isbit = match a.get(4) {
                Some(u) => unit(u)?,
                None => false,
            };
            resolve(start, end, len, isbit)
        }
        2 => resolve(0, -1, len, false),
        _ => return Err(CmdError::Syntax),
    };
    let n = match range {
        None => 0,
        Some(r) => {
            let v = &ctx.ks.raw[o..];
            let mut n = popcount(&v[r.start..=r.end]);
            let edges = [v[r.start] & r.first_mask, v[r.end] & r.last_mask];
            n -= popcount(&edges);
            n
        }
    };
    c.int(n as i64);
    Ok(())
}

/// The first bit equal to `bit` in `b`; not found: -1 for a 1, and for a 0
/// the bit right after `b` (a string is zero-padded on the right).
fn first_bit(b: &[u8], bit: bool) -> i64 {
    let skip = if bit { 0u8 } else { 0xff };
    match b.iter().position(|&x| x != skip) {
        Some(i) => {
            let x = if bit { b[i] } else { !b[i] };
            (i as i64) * 8 + i64::from(x.leading_zeros() as u8)
        }
        None if bit => -1,
        None => b.len() as i64 * 8,
    }
}

pub fn bitpos(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let bit = int_arg(&a[2])?;
    if bit != 0 && bit != 1 {
        return Err(CmdError::Msg("The bit argument must be 1 or 0."));
    }
    let bit = bit == 1;
    let Some(o) = read_at(ctx, c, &a[1])? else {
        c.int(if bit { -1 } else { 0 });
        return Ok(());
    };
    let len = ctx.ks.raw.len() - o;
    let mut end_given = false;
    let range = match a.len() {
        4..=6 => {
            let start = int_arg(&a[3])?;
            let isbit = match a.get(5) {
                Some(u) => unit(u)?,
                None => false,
            };
            let end = match a.get(4) {
                Some(e) => {
                    end_given = true;
                    int_arg(e)?
                }
                None if isbit => ((len as i64) << 3) + 7,
                None => len as i64 - 1,
            };
            resolve(start, end, len, isbit)
        }
        3 => resolve(0, -1, len, false),
        _ => return Err(CmdError::Syntax),
    };
    let Some(r) = range else {
        c.int(-1);
        return Ok(());
    };
    let v = &ctx.ks.raw[o..];
    // Redis's walk: the first byte alone when it has bits outside the
    // range, then the whole bytes, then the last byte alone likewise.
    let (mut start, mut bytes) = (r.start, r.end - r.start + 1);
    let pos;
    'found: {
        if r.first_mask != 0 {
            let mut t = if bit {
                v[start] & !r.first_mask
            } else {
                v[start] | r.first_mask
            };
            if r.last_mask != 0 && bytes == 1 {
                t = if bit {
                    t & !r.last_mask
                } else {
                    t | r.last_mask
                };
            }
            let p = first_bit(&[t], bit);
            if bytes == 1 || (p != -1 && p != 8) {
                pos = p;
                break 'found;
            }
            start += 1;
            bytes -= 1;
        }
        let cur = bytes - usize::from(r.last_mask != 0);
        if cur > 0 {
            let p = first_bit(&v[start..start + cur], bit);
            if bytes == cur || (p != -1 && p != (cur as i64) << 3) {
                pos = p;
                break 'found;
            }
            start += cur;
            bytes -= cur;
        }
        let t = if bit {
            v[r.end] & !r.last_mask
        } else {
            v[r.end] | r.last_mask
        };
        pos = first_bit(&[t], bit);
    }
    // A 0 searched in an explicit range that has none: the bit after the
    // range does not count.
    if end_given && !bit && pos == (bytes as i64) << 3 {
        c.int(-1);
        return Ok(());
    }
    c.int(if pos != -1 {
        pos + ((start as i64) << 3)
    } else {
        pos
    });
    Ok(())
}

pub fn bitop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    #[derive(Clone, Copy, PartialEq)]
    enum Op {
        And,
        Or,
        Xor,
        Not,
    }
    let op = if eq(&a[1], "and") {
        Op::And
    } else if eq(&a[1], "or") {
        Op::Or
    } else if eq(&a[1], "xor") {
        Op::Xor
    } else if eq(&a[1], "not") {
        Op::Not
    } else {
        return Err(CmdError::Syntax);
    };
    if op == Op::Not && a.len() != 4 {
        return Err(CmdError::Msg(
            "BITOP NOT must be called with a single source key.",
        ));
    }
    let dest = skey(c.db, &a[2]);
    let srcs: Vec<Vec<u8>> = a[3..].iter().map(|k| skey(c.db, k)).collect();
    let mut keys: Vec<&[u8]> = srcs.iter().map(|k| k.as_slice()).collect();
    keys.push(&dest);
    let len = locked(ctx, &keys, |ctx| {
        let mut vals: Vec<Vec<u8>> = Vec::with_capacity(srcs.len());
        for sk in &srcs {
            match ctx.ks.lookup_locked(sk, ctx.now)? {
                Some(h) if h.kind != KIND_STRING => return Err(CmdError::WrongType),
                Some(h) => vals.push(ctx.ks.raw[h.off..].to_vec()),
                None => vals.push(Vec::new()),
            }
        }
        let max = vals.iter().map(|v| v.len()).max().unwrap_or(0);
        if max == 0 {
            if ctx.ks.delete(&dest, ctx.now)? {
                crate::notify::event(ctx, crate::notify::GENERIC, "del", c.db, &a[2]);
            }
            return Ok(0);
        }
        let mut res = vals[0].clone();
        res.resize(max, 0);
        match op {
            Op::Not => res.iter_mut().for_each(|b| *b = !*b),
            _ => {
                for v in &vals[1..] {
                    for (i, r) in res.iter_mut().enumerate() {
                        let b = v.get(i).copied().unwrap_or(0);
                        match op {
                            Op::And => *r &= b,
                            Op::Or => *r |= b,
                            _ => *r ^= b,
                        }
                    }
                }
            }
        }
        super::strings::store(ctx, &dest, None, &res)?;
        crate::notify::event(ctx, crate::notify::STRING, "set", c.db, &a[2]);
        Ok(max)
    })?;
    c.int(len as i64);
    Ok(())
}

/// BITFIELD's overflow behaviours.
#[derive(Clone, Copy, PartialEq)]
enum Overflow {
    Wrap,
    Sat,
    Fail,
}

#[derive(Clone, Copy, PartialEq)]
enum FieldOp {
    Get,
    Set,
    Incr,
}

struct Field {
    op: FieldOp,
    offset: u64,
    bits: u32,
    signed: bool,
    arg: i64,
    overflow: Overflow,
}

/// A bitfield type: `i1`..`i64` or `u1`..`u63` (the digits end at a NUL
/// byte, as C reads them).
fn field_type(a: &[u8]) -> Result<(bool, u32), CmdError> {
    let signed = match a.first() {
        Some(b'i') => true,
        Some(b'u') => false,
        _ => return Err(CmdError::BitfieldType),
    };
    let digits = a[1..].split(|&b| b == 0).next().unwrap_or_default();
    match proto::int::parse_i64(digits) {
        Some(n) if n >= 1 && n <= if signed { 64 } else { 63 } => Ok((signed, n as u32)),
        _ => Err(CmdError::BitfieldType),
    }
}

/// Parses BITFIELD's subcommands as Redis does (every error before any
/// operation runs); true when some write.
fn parse_fields(a: &[Vec<u8>], max: u64) -> Result<(Vec<Field>, bool), CmdError> {
    let mut fields = Vec::new();
    let mut overflow = Overflow::Wrap;
    let mut writes = false;
    let mut j = 2;
    while j < a.len() {
        let rem = a.len() - j - 1;
        let sub = &a[j];
        let op = if eq(sub, "get") && rem >= 2 {
            FieldOp::Get
        } else if eq(sub, "set") && rem >= 3 {
            FieldOp::Set
        } else if eq(sub, "incrby") && rem >= 3 {
            FieldOp::Incr
        } else if eq(sub, "overflow") && rem >= 1 {
            let t = &a[j + 1];
            overflow = if eq(t, "wrap") {
                Overflow::Wrap
            } else if eq(t, "sat") {
                Overflow::Sat
            } else if eq(t, "fail") {
                Overflow::Fail
            } else {
                return Err(CmdError::Msg("Invalid OVERFLOW type specified"));
            };
            j += 2;
            continue;
        } else {
            return Err(CmdError::Syntax);
        };
        let (signed, bits) = field_type(&a[j + 1])?;
        let offset = bit_offset(&a[j + 2], Some(bits), max)?;
        let mut arg = 0;
        if op != FieldOp::Get {
            writes = true;
            arg = int_arg(&a[j + 3])?;
        }
        fields.push(Field {
            op,
            offset,
            bits,
            signed,
            arg,
            overflow,
        });
        j += if op == FieldOp::Get { 3 } else { 4 };
    }
    Ok((fields, writes))
}

/// The unsigned integer of `bits` bits at bit `offset` (zeros past the end).
fn get_unsigned(v: &[u8], offset: u64, bits: u32) -> u64 {
    let mut value = 0u64;
    for i in 0..u64::from(bits) {
        let o = offset + i;
        let b = v.get((o >> 3) as usize).copied().unwrap_or(0);
        value = (value << 1) | u64::from((b >> (7 - (o & 7))) & 1);
    }
    value
}

fn get_signed(v: &[u8], offset: u64, bits: u32) -> i64 {
    let mut value = get_unsigned(v, offset, bits);
    if bits < 64 && value & (1u64 << (bits - 1)) != 0 {
        value |= u64::MAX << bits;
    }
    value as i64
}

/// Writes the low `bits` bits of `value` at bit `offset` (`v` is long
/// enough: grown to the highest bit written).
fn set_bits(v: &mut [u8], offset: u64, bits: u32, value: u64) {
    for i in 0..u64::from(bits) {
        let bit = (value >> (u64::from(bits) - 1 - i)) & 1;
        let o = offset + i;
        if let Some(b) = v.get_mut((o >> 3) as usize) {
            let sh = 7 - (o & 7);
            *b = (*b & !(1 << sh)) | ((bit as u8) << sh);
        }
    }
}

/// Redis's `checkUnsignedBitfieldOverflow`: whether `value + incr` leaves
/// the `bits`-bit range, and the value WRAP or SAT stores then.
fn unsigned_overflow(value: u64, incr: i64, bits: u32, ow: Overflow) -> Option<u64> {
    let max = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let maxincr = max.wrapping_sub(value) as i64;
    let minincr = value.wrapping_neg() as i64;
    let wrap = || value.wrapping_add(incr as u64) & !(u64::MAX << bits);
    if value > max || (incr > 0 && incr > maxincr) {
        Some(match ow {
            Overflow::Wrap => wrap(),
            _ => max,
        })
    } else if incr < 0 && incr < minincr {
        Some(match ow {
            Overflow::Wrap => wrap(),
            _ => 0,
        })
    } else {
        None
    }
}

/// Redis's `checkSignedBitfieldOverflow` (C's wrapping arithmetic kept).
fn signed_overflow(value: i64, incr: i64, bits: u32, ow: Overflow) -> Option<i64> {
    let max = if bits == 64 {
        i64::MAX
    } else {
        (1i64 << (bits - 1)) - 1
    };
    let min = -max - 1;
    let maxincr = (max as u64).wrapping_sub(value as u64) as i64;
    let minincr = min.wrapping_sub(value);
    let wrap = || {
        let mut c = (value as u64).wrapping_add(incr as u64);
        if bits < 64 {
            let mask = u64::MAX << bits;
            if c & (1u64 << (bits - 1)) != 0 {
                c |= mask;
            } else {
                c &= !mask;
            }
        }
        c as i64
    };
    let big = bits != 64;
    if value > max || (big && incr > maxincr) || (value >= 0 && incr > 0 && incr > maxincr) {
        Some(match ow {
            Overflow::Wrap => wrap(),
            _ => max,
        })
    } else if value < min || (big && incr < minincr) || (value < 0 && incr < 0 && incr < minincr) {
        Some(match ow {
            Overflow::Wrap => wrap(),
            _ => min,
        })
    } else {
        None
    }
}

/// Runs the fields on `v`, replying each result (None for a FAIL overflow).
fn run_fields(v: &mut [u8], fields: &[Field], out: &mut Vec<Option<i64>>) {
    for f in fields {
        let (off, bits) = (f.offset, f.bits);
        if f.op == FieldOp::Get {
            out.push(Some(if f.signed {
                get_signed(v, off, bits)
            } else {
                get_unsigned(v, off, bits) as i64
            }));
            continue;
        }
        let (fail, ret, new) = if f.signed {
            let old = get_signed(v, off, bits);
            if f.op == FieldOp::Incr {
                let o = signed_overflow(old, f.arg, bits, f.overflow);
                let new = o.unwrap_or(old.wrapping_add(f.arg));
                (o.is_some(), new, new as u64)
            } else {
                let o = signed_overflow(f.arg, 0, bits, f.overflow);
                (o.is_some(), old, o.unwrap_or(f.arg) as u64)
            }
        } else {
            let old = get_unsigned(v, off, bits);
            if f.op == FieldOp::Incr {
                let o = unsigned_overflow(old, f.arg, bits, f.overflow);
                let new = o.unwrap_or(old.wrapping_add(f.arg as u64));
                (o.is_some(), new as i64, new)
            } else {
                let o = unsigned_overflow(f.arg as u64, 0, bits, f.overflow);
                (o.is_some(), old as i64, o.unwrap_or(f.arg as u64))
            }
        };
        if fail && f.overflow == Overflow::Fail {
            out.push(None);
        } else {
            set_bits(v, off, bits, new);
            out.push(Some(ret));
        }
    }
}

fn reply_fields(c: &mut Client, out: &[Option<i64>]) {
    c.array_header(out.len());
    for r in out {
        match r {
            Some(n) => c.int(*n),
            None => c.null(),
        }
    }
}

fn bitfield_generic(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], ro: bool) -> R {
    let (fields, writes) = parse_fields(a, max_bytes(ctx))?;
    let mut out = Vec::with_capacity(fields.len());
    if !writes {
        let mut v = match read_at(ctx, c, &a[1])? {
            Some(o) => {
                // GETs read at most 9 bytes from each offset: copy only
                // what they reach.
                let s = &ctx.ks.raw[o..];
                let reach = fields
                    .iter()
                    .map(|f| ((f.offset + u64::from(f.bits)) >> 3) as usize + 1)
                    .max()
                    .unwrap_or(0);
                s[..reach.min(s.len())].to_vec()
            }
            None => Vec::new(),
        };
        run_fields(&mut v, &fields, &mut out);
        reply_fields(c, &out);
        return Ok(());
    }
    if ro {
        return Err(CmdError::Msg(
            "BITFIELD_RO only supports the GET subcommand",
        ));
    }
    let highest = fields
        .iter()
        .filter(|f| f.op != FieldOp::Get)
        .map(|f| f.offset + u64::from(f.bits) - 1)
        .max()
        .unwrap_or(0);
    rewrite(ctx, c, &a[1], |cur| {
        let mut v = grown(cur, highest >> 3);
        run_fields(&mut v, &fields, &mut out);
        let changed = cur != Some(v.as_slice());
        Ok((changed.then_some(v), ()))
    })?;
    // Redis's `changes`: the SETs and INCRBYs that did not fail on overflow.
    if fields
        .iter()
        .zip(&out)
        .any(|(f, o)| f.op != FieldOp::Get && o.is_some())
    {
        crate::notify::event(ctx, crate::notify::STRING, "setbit", c.db, &a[1]);
    }
    reply_fields(c, &out);
    Ok(())
}

/// Whether a BITFIELD request only reads its key, for ACL key checks
/// (Redis's `bitfieldGetKeys`: GETs and OVERFLOWs only; a SET, an INCRBY or
/// anything it does not parse makes it a write).
pub fn bitfield_reads_only(a: &[Vec<u8>]) -> bool {
    let mut i = 2;
    while i < a.len() {
        let rem = a.len() - i - 1;
        if eq(&a[i], "get") && rem >= 2 {
            i += 3;
        } else if eq(&a[i], "overflow") && rem >= 1 {
            i += 2;
        } else {
            return false;
        }
    }
    true
}

pub fn bitfield(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    bitfield_generic(ctx, c, a, false)
}

pub fn bitfield_ro(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    bitfield_generic(ctx, c, a, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_and_write_like_redis() {
        // Redis's example: u5 = 23 at offset 7 over zeros.
        let mut v = vec![0u8; 2];
        set_bits(&mut v, 7, 5, 23);
        assert_eq!(v, [0b0000_0001, 0b0111_0000]);
        assert_eq!(get_unsigned(&v, 7, 5), 23);
        assert_eq!(get_signed(&v, 7, 5), 23 - 32);
        assert_eq!(get_unsigned(&v, 100, 8), 0);
        let mut w = vec![0u8; 8];
        set_bits(&mut w, 0, 64, u64::MAX);
        assert_eq!(get_signed(&w, 0, 64), -1);
    }

    #[test]
    fn overflow_rules_match_redis() {
        use Overflow::*;
        assert_eq!(unsigned_overflow(250, 10, 8, Wrap), Some(4));
        assert_eq!(unsigned_overflow(250, 10, 8, Sat), Some(255));
        assert_eq!(unsigned_overflow(5, -10, 8, Sat), Some(0));
        assert_eq!(unsigned_overflow(5, -10, 8, Wrap), Some(251));
        assert_eq!(unsigned_overflow(5, 10, 8, Fail), None);
        assert_eq!(signed_overflow(120, 10, 8, Wrap), Some(-126));
        assert_eq!(signed_overflow(120, 10, 8, Sat), Some(127));
        assert_eq!(signed_overflow(-120, -10, 8, Sat), Some(-128));
        assert_eq!(signed_overflow(i64::MAX, 1, 64, Wrap), Some(i64::MIN));
        assert_eq!(signed_overflow(i64::MIN, -1, 64, Sat), Some(i64::MIN));
        assert_eq!(signed_overflow(i64::MIN, i64::MIN, 64, Wrap), Some(0));
        assert_eq!(signed_overflow(0, i64::MIN, 64, Wrap), None);
        // Redis: BITFIELD k OVERFLOW WRAP INCRBY u63 0 -9223372036854775808 is 0.
        assert_eq!(unsigned_overflow(0, i64::MIN, 63, Wrap), Some(0));
    }

    #[test]
    fn offsets_and_types_are_checked() {
        let max = 512 * 1024 * 1024;
        assert_eq!(bit_offset(b"4294967295", None, max).unwrap(), 4294967295);
        assert!(bit_offset(b"4294967296", None, max).is_err());
        assert!(bit_offset(b"-1", None, max).is_err());
        assert_eq!(bit_offset(b"#3", Some(8), max).unwrap(), 24);
        assert!(bit_offset(b"#3", None, max).is_err());
        assert!(bit_offset(b"#9223372036854775807", Some(8), max).is_err());
        assert_eq!(field_type(b"u63").unwrap(), (false, 63));
        assert!(field_type(b"u64").is_err());
        assert_eq!(field_type(b"i64").unwrap(), (true, 64));
        assert!(field_type(b"i0").is_err());
        assert!(field_type(b"I8").is_err());
        assert!(field_type(b"").is_err());
        assert_eq!(field_type(b"u8\0x").unwrap(), (false, 8));
    }

    #[test]
    fn first_bit_and_ranges() {
        assert_eq!(first_bit(&[0x00, 0x10], true), 11);
        assert_eq!(first_bit(&[0xff, 0xfe], false), 15);
        assert_eq!(first_bit(&[0xff], false), 8);
        assert_eq!(first_bit(&[0x00], true), -1);
        assert!(resolve(0, -1, 0, false).is_none());
        let r = resolve(3, 12, 4, true).unwrap();
        assert_eq!(
            (r.start, r.end, r.first_mask, r.last_mask),
            (0, 1, 0xe0, 0x07)
        );
        assert_eq!(popcount(&[0xff; 13]), 104);
    }
}
