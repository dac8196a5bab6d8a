//! Redis's serialization format (RDB version 10, Redis 7.0) for DUMP and
//! RESTORE: a value is its RDB type byte and object encoding, then the RDB
//! version (2 bytes, little-endian) and a CRC-64 (Jones, Redis's `crc64`;
//! 8 bytes, little-endian) of everything before it.
//!
//! [`dump`] writes the plain encodings every Redis since 2.x loads (a string;
//! a list, set or hash as its elements; a sorted set as members with binary
//! doubles: RDB types 0, 1, 2, 4, 5), so a value DUMPed here RESTOREs in
//! Redis. [`restore`] reads those and every encoding Redis 7.0 (and older
//! versions, up to RDB 10) writes for these types: integer and LZF-compressed
//! strings, listpacks (hashes, sorted sets, quicklist 2 lists), ziplists,
//! quicklists and intsets; and streams in Redis's own encoding (RDB types
//! 15 and 19: listpacks of entries under master IDs, then the stream's
//! counters, its consumer groups, their pending entries and consumers),
//! which both write and read. Modules and the pre-2.6 zipmap are refused
//! as data this version does not read. Facts from Redis's rdb.h,
//! rdb.c, listpack.c, ziplist.c and intset.c; the code is ours.

use crc::{Crc, CRC_64_REDIS};
use engine::types::stream::Sid;

/// The RDB version written, and the newest read.
pub const RDB_VERSION: u16 = 10;

const CRC64: Crc<u64> = Crc::<u64>::new(&CRC_64_REDIS);

const TYPE_STRING: u8 = 0;
const TYPE_LIST: u8 = 1;
const TYPE_SET: u8 = 2;
const TYPE_ZSET: u8 = 3;
const TYPE_HASH: u8 = 4;
const TYPE_ZSET_2: u8 = 5;
const TYPE_LIST_ZIPLIST: u8 = 10;
const TYPE_SET_INTSET: u8 = 11;
const TYPE_ZSET_ZIPLIST: u8 = 12;
const TYPE_HASH_ZIPLIST: u8 = 13;
const TYPE_LIST_QUICKLIST: u8 = 14;
const TYPE_HASH_LISTPACK: u8 = 16;
const TYPE_ZSET_LISTPACK: u8 = 17;
const TYPE_LIST_QUICKLIST_2: u8 = 18;
const TYPE_STREAM_LISTPACKS: u8 = 15;
const TYPE_STREAM_LISTPACKS_2: u8 = 19;

/// Stream entry flags in a listpack (t_stream.c).
const STREAM_ITEM_DELETED: i64 = 1;
const STREAM_ITEM_SAMEFIELDS: i64 = 2;
/// Entries per listpack node when writing (Redis's `stream-node-max-entries`).
const STREAM_NODE_ENTRIES: usize = 100;

/// A stream as its RDB encoding holds it.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct StreamValue {
    /// Entries in ID order.
    pub entries: Vec<(Sid, engine::types::stream::Pairs)>,
    pub last: Sid,
    pub first: Sid,
    pub max_deleted: Sid,
    pub entries_added: u64,
    pub groups: Vec<GroupValue>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GroupValue {
    pub name: Vec<u8>,
    pub last: Sid,
    /// -1: unknown.
    pub entries_read: i64,
    /// Pending entries in ID order: (id, delivery time, deliveries, consumer).
    pub pel: Vec<(Sid, i64, u64, Vec<u8>)>,
    /// Consumers and their seen times.
    pub consumers: Vec<(Vec<u8>, i64)>,
}

/// A value as DUMP and RESTORE see it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    String(Vec<u8>),
    List(Vec<Vec<u8>>),
    Set(Vec<Vec<u8>>),
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    /// Members and scores.
    Zset(Vec<(Vec<u8>, f64)>),
    Stream(StreamValue),
}

/// Why a payload was refused (RESTORE's two errors).
#[derive(Debug, PartialEq, Eq)]
pub enum RdbError {
    /// Too short, a newer RDB version, or a checksum that does not match.
    VersionOrChecksum,
    /// Not an encoding this version reads, or malformed.
    BadFormat,
}

type Res<T> = Result<T, RdbError>;

/// Appends an RDB length.
pub fn put_len(out: &mut Vec<u8>, n: u64) {
    if n < 1 << 6 {
        out.push(n as u8);
    } else if n < 1 << 14 {
        out.push(0x40 | (n >> 8) as u8);
        out.push(n as u8);
    } else if n <= u32::MAX as u64 {
        out.push(0x80);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// Appends an RDB string (raw: a length, then the bytes).
pub fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_len(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// The DUMP payload of `v`.
pub fn dump(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode(&mut out, v);
    footer(&mut out);
    out
}

/// Appends `v` as an RDB value: its type byte, then its encoding (as in a
/// DUMP payload before the footer).
pub fn encode(out: &mut Vec<u8>, v: &Value) {
    encode_keyed(out, None, v);
}

/// Appends `v` as [`encode`] does, with `key` (an RDB file's key record:
/// the type byte, the key, the value) when given.
pub fn encode_keyed(out: &mut Vec<u8>, key: Option<&[u8]>, v: &Value) {
    out.push(match v {
        Value::String(_) => TYPE_STRING,
        Value::List(_) => TYPE_LIST,
        Value::Set(_) => TYPE_SET,
        Value::Hash(_) => TYPE_HASH,
        Value::Zset(_) => TYPE_ZSET_2,
        Value::Stream(_) => TYPE_STREAM_LISTPACKS_2,
    });
    if let Some(k) = key {
        put_str(out, k);
    }
    match v {
        Value::String(s) => put_str(out, s),
        Value::List(items) | Value::Set(items) => {
            put_len(out, items.len() as u64);
            for i in items {
                put_str(out, i);
            }
        }
        Value::Hash(pairs) => {
            put_len(out, pairs.len() as u64);
            for (f, x) in pairs {
                put_str(out, f);
                put_str(out, x);
            }
        }
        Value::Zset(members) => {
            put_len(out, members.len() as u64);
            // Redis writes a skiplist's members from the highest score down,
            // so that loading inserts each at the head.
            for (m, s) in members.iter().rev() {
                put_str(out, m);
                out.extend_from_slice(&s.to_le_bytes());
            }
        }
        Value::Stream(sv) => dump_stream(out, sv),
    }
}

/// A function library in an RDB (7.0 GA on): its code, whose shebang
/// names it.
pub const OPCODE_FUNCTION2: u8 = 245;
/// The 7.0 release candidates' form: name, engine, description, code.
pub const OPCODE_FUNCTION_PRE_GA: u8 = 246;

/// FUNCTION DUMP's payload, as Redis writes it: each library as an RDB
/// function record, then the version and CRC-64 footer.
pub fn dump_functions<'a>(codes: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for code in codes {
        out.push(OPCODE_FUNCTION2);
        put_str(&mut out, code);
    }
    footer(&mut out);
    out
}

/// The library codes of a FUNCTION DUMP payload whose footer [`verify`]
/// accepted (Redis's or Ember's: the same format). The error is Redis's
/// text, without `ERR `.
pub fn restore_functions(p: &[u8]) -> Result<Vec<Vec<u8>>, &'static str> {
    let body = &p[..p.len().saturating_sub(10)];
    let mut r = Rd { b: body, at: 0 };
    let mut codes = Vec::new();
    while r.at < body.len() {
        let t = r.u8().map_err(|_| "can not read data type")?;
        match t {
            OPCODE_FUNCTION2 => {
                codes.push(r.string().map_err(|_| "Failed loading library payload")?);
            }
            OPCODE_FUNCTION_PRE_GA => {
                let name = r.string().map_err(|_| "Failed loading library name")?;
                let engine = r.string().map_err(|_| "Failed loading engine name")?;
                let has_desc = r
                    .length()
                    .map_err(|_| "Failed loading library description indicator")?;
                if has_desc != 0 {
                    r.string()
                        .map_err(|_| "Failed loading library description")?;
                }
                let blob = r.string().map_err(|_| "Failed loading library blob")?;
                // Redis turns it into the GA form: a shebang naming it.
                let mut code = b"#!".to_vec();
                code.extend_from_slice(&engine);
                code.extend_from_slice(b" name=");
                code.extend_from_slice(&name);
                code.push(b'\n');
                code.extend_from_slice(&blob);
                codes.push(code);
            }
            _ => return Err("given type is not a function"),
        }
    }
    Ok(codes)
}

/// Appends the RDB version and the CRC-64 of everything before it.
fn footer(out: &mut Vec<u8>) {
    out.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = CRC64.checksum(out);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Checks a payload's footer (Redis's `verifyDumpPayload`).
pub fn verify(p: &[u8]) -> Res<()> {
    if p.len() < 10 {
        return Err(RdbError::VersionOrChecksum);
    }
    let footer = &p[p.len() - 10..];
    let ver = u16::from_le_bytes([footer[0], footer[1]]);
    if ver > RDB_VERSION {
        return Err(RdbError::VersionOrChecksum);
    }
    let crc = CRC64.checksum(&p[..p.len() - 8]);
    if crc.to_le_bytes() != footer[2..] {
        return Err(RdbError::VersionOrChecksum);
    }
    Ok(())
}

/// The value of a payload whose footer [`verify`] accepted. An empty
/// collection is bad data, as in Redis.
pub fn restore(p: &[u8]) -> Res<Value> {
    verify(p)?;
    let body = &p[..p.len() - 10];
    let mut r = Rd { b: body, at: 0 };
    let t = r.u8()?;
    read_value(&mut r, t)
}

/// Whether `t` is a value type byte this version reads with [`read_value`]
/// (Redis's `rdbIsObjectType`, less modules and the zipmap).
pub fn is_value_type(t: u8) -> bool {
    matches!(t, 0..=5 | 10..=19)
}

/// The value of type `t` read from `r` (the type byte already read). An
/// empty collection is bad data, as in Redis.
pub fn read_value<I: Input>(r: &mut I, t: u8) -> Res<Value> {
    let v = match t {
        TYPE_STRING => Value::String(r.string()?),
        TYPE_LIST => Value::List(r.strings(1)?),
        TYPE_SET => Value::Set(r.strings(1)?),
        TYPE_HASH => Value::Hash(pairs(r.strings(2)?)),
        TYPE_ZSET | TYPE_ZSET_2 => {
            let n = r.length()?;
            let mut v = Vec::new();
            for _ in 0..n {
                let m = r.string()?;
                let s = if t == TYPE_ZSET_2 {
                    f64::from_le_bytes(r.array::<8>()?)
                } else {
                    r.text_double()?
                };
                if s.is_nan() {
                    return Err(RdbError::BadFormat);
                }
                v.push((m, s));
            }
            // Written from the highest score down (see `dump`).
            v.reverse();
            Value::Zset(v)
        }
        TYPE_SET_INTSET => Value::Set(intset(&r.string()?)?),
        TYPE_LIST_ZIPLIST => Value::List(ziplist(&r.string()?)?),
        TYPE_HASH_ZIPLIST => Value::Hash(pairs(even(ziplist(&r.string()?)?)?)),
        TYPE_ZSET_ZIPLIST => Value::Zset(scored(ziplist(&r.string()?)?)?),
        TYPE_HASH_LISTPACK => Value::Hash(pairs(even(listpack(&r.string()?)?)?)),
        TYPE_ZSET_LISTPACK => Value::Zset(scored(listpack(&r.string()?)?)?),
        TYPE_LIST_QUICKLIST | TYPE_LIST_QUICKLIST_2 => {
            let n = r.length()?;
            let mut items = Vec::new();
            for _ in 0..n {
                let container = if t == TYPE_LIST_QUICKLIST_2 {
                    r.length()?
                } else {
                    2
                };
                let data = r.string()?;
                match container {
                    // A plain node: one large element.
                    1 => items.push(data),
                    2 if t == TYPE_LIST_QUICKLIST_2 => items.extend(listpack(&data)?),
                    2 => items.extend(ziplist(&data)?),
                    _ => return Err(RdbError::BadFormat),
                }
            }
            Value::List(items)
        }
        TYPE_STREAM_LISTPACKS | TYPE_STREAM_LISTPACKS_2 => {
            Value::Stream(load_stream(r, t == TYPE_STREAM_LISTPACKS_2)?)
        }
        _ => return Err(RdbError::BadFormat),
    };
    let empty = match &v {
        Value::Stream(_) => false,
        Value::String(_) => false,
        Value::List(x) | Value::Set(x) => x.is_empty(),
        Value::Hash(x) => x.is_empty(),
        Value::Zset(x) => x.is_empty(),
    };
    if empty {
        return Err(RdbError::BadFormat);
    }
    Ok(v)
}

fn even(v: Vec<Vec<u8>>) -> Res<Vec<Vec<u8>>> {
    if !v.len().is_multiple_of(2) {
        return Err(RdbError::BadFormat);
    }
    Ok(v)
}

fn pairs(v: Vec<Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::with_capacity(v.len() / 2);
    let mut it = v.into_iter();
    while let (Some(a), Some(b)) = (it.next(), it.next()) {
        out.push((a, b));
    }
    out
}

/// Member, score pairs of a listpack or ziplist (scores as text).
fn scored(v: Vec<Vec<u8>>) -> Res<Vec<(Vec<u8>, f64)>> {
    pairs(even(v)?)
        .into_iter()
        .map(|(m, s)| {
            let s = parse_double(&s)?;
            Ok((m, s))
        })
        .collect()
}

fn parse_double(s: &[u8]) -> Res<f64> {
    let t = std::str::from_utf8(s).map_err(|_| RdbError::BadFormat)?;
    let v = match t {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        _ => t.parse::<f64>().map_err(|_| RdbError::BadFormat)?,
    };
    if v.is_nan() {
        return Err(RdbError::BadFormat);
    }
    Ok(v)
}

/// A payload or blob in memory.
struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Res<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(RdbError::BadFormat)?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
}

impl Input for Rd<'_> {
    fn bytes(&mut self, n: usize) -> Res<Vec<u8>> {
        Ok(self.take(n)?.to_vec())
    }

    fn fill(&mut self, buf: &mut [u8]) -> Res<()> {
        buf.copy_from_slice(self.take(buf.len())?);
        Ok(())
    }

    fn left(&self) -> u64 {
        (self.b.len() - self.at) as u64
    }
}

/// Where RDB values are read from: a DUMP payload in memory, or an RDB file
/// read as a stream. The encodings' readers are its provided methods.
pub trait Input {
    /// The next `n` bytes (refused, before anything is allocated, when
    /// fewer are left).
    fn bytes(&mut self, n: usize) -> Res<Vec<u8>>;

    /// Fills `buf` with the next bytes.
    fn fill(&mut self, buf: &mut [u8]) -> Res<()>;

    /// How many bytes are left at most (counts that could not fit are
    /// refused before anything is allocated).
    fn left(&self) -> u64;

    fn array<const N: usize>(&mut self) -> Res<[u8; N]>
    where
        Self: Sized,
    {
        let mut a = [0u8; N];
        self.fill(&mut a)?;
        Ok(a)
    }

    fn u8(&mut self) -> Res<u8>
    where
        Self: Sized,
    {
        Ok(self.array::<1>()?[0])
    }

    /// A length, or (`.1`) a special encoding.
    fn len_or_enc(&mut self) -> Res<(u64, Option<u8>)>
    where
        Self: Sized,
    {
        let b = self.u8()?;
        match b >> 6 {
            0 => Ok((u64::from(b & 0x3f), None)),
            1 => Ok(((u64::from(b & 0x3f) << 8) | u64::from(self.u8()?), None)),
            3 => Ok((0, Some(b & 0x3f))),
            _ => match b {
                0x80 => Ok((u64::from(u32::from_be_bytes(self.array()?)), None)),
                0x81 => Ok((u64::from_be_bytes(self.array()?), None)),
                _ => Err(RdbError::BadFormat),
            },
        }
    }

    fn length(&mut self) -> Res<u64>
    where
        Self: Sized,
    {
        match self.len_or_enc()? {
            (n, None) => Ok(n),
            _ => Err(RdbError::BadFormat),
        }
    }

    /// A string object: raw, an integer, or LZF-compressed.
    fn string(&mut self) -> Res<Vec<u8>>
    where
        Self: Sized,
    {
        match self.len_or_enc()? {
            (n, None) => self.bytes(usize::try_from(n).map_err(|_| RdbError::BadFormat)?),
            (_, Some(0)) => Ok((self.u8()? as i8).to_string().into_bytes()),
            (_, Some(1)) => Ok(i16::from_le_bytes(self.array()?).to_string().into_bytes()),
            (_, Some(2)) => Ok(i32::from_le_bytes(self.array()?).to_string().into_bytes()),
            (_, Some(3)) => {
                let clen = usize::try_from(self.length()?).map_err(|_| RdbError::BadFormat)?;
                let len = usize::try_from(self.length()?).map_err(|_| RdbError::BadFormat)?;
                let data = self.bytes(clen)?;
                // A declared length no payload this size could expand to is
                // refused before anything is allocated (LZF expands at most
                // about 32 times in practice; allow far more).
                if len > clen.saturating_mul(1024).max(64) {
                    return Err(RdbError::BadFormat);
                }
                let out = lzf::decompress(&data, len).map_err(|_| RdbError::BadFormat)?;
                if out.len() != len {
                    return Err(RdbError::BadFormat);
                }
                Ok(out)
            }
            _ => Err(RdbError::BadFormat),
        }
    }

    /// `per` strings for each of a length's worth.
    fn strings(&mut self, per: u64) -> Res<Vec<Vec<u8>>>
    where
        Self: Sized,
    {
        let n = self.length()?;
        let total = n.checked_mul(per).ok_or(RdbError::BadFormat)?;
        // Each string takes at least one byte of payload.
        if total > self.left() {
            return Err(RdbError::BadFormat);
        }
        (0..total).map(|_| self.string()).collect()
    }

    /// A double as text (RDB type 3): a length byte, or 253 nan, 254 +inf,
    /// 255 -inf.
    fn text_double(&mut self) -> Res<f64>
    where
        Self: Sized,
    {
        match self.u8()? {
            253 => Err(RdbError::BadFormat),
            254 => Ok(f64::INFINITY),
            255 => Ok(f64::NEG_INFINITY),
            n => parse_double(&self.bytes(n as usize)?),
        }
    }
}

/// The elements of an intset blob: u32 width, u32 count, sorted integers.
fn intset(b: &[u8]) -> Res<Vec<Vec<u8>>> {
    let mut r = Rd { b, at: 0 };
    let width = u32::from_le_bytes(r.take(4)?.try_into().expect("4")) as usize;
    let n = u32::from_le_bytes(r.take(4)?.try_into().expect("4")) as usize;
    if !matches!(width, 2 | 4 | 8) || n.checked_mul(width) != Some(b.len() - 8) {
        return Err(RdbError::BadFormat);
    }
    (0..n)
        .map(|_| {
            let s = r.take(width)?;
            let v = match width {
                2 => i64::from(i16::from_le_bytes(s.try_into().expect("2"))),
                4 => i64::from(i32::from_le_bytes(s.try_into().expect("4"))),
                _ => i64::from_le_bytes(s.try_into().expect("8")),
            };
            Ok(v.to_string().into_bytes())
        })
        .collect()
}

/// The elements of a listpack blob (integers as their decimal text).
pub fn listpack(b: &[u8]) -> Res<Vec<Vec<u8>>> {
    if b.len() < 7 || u32::from_le_bytes(b[..4].try_into().expect("4")) as usize != b.len() {
        return Err(RdbError::BadFormat);
    }
    let mut r = Rd { b, at: 6 };
    let mut out = Vec::new();
    loop {
        let start = r.at;
        let e = r.u8()?;
        let item: Vec<u8> = if e == 0xFF {
            if r.at != b.len() {
                return Err(RdbError::BadFormat);
            }
            return Ok(out);
        } else if e & 0x80 == 0 {
            (e & 0x7f).to_string().into_bytes()
        } else if e & 0xC0 == 0x80 {
            r.take((e & 0x3f) as usize)?.to_vec()
        } else if e & 0xE0 == 0xC0 {
            let v = ((u16::from(e & 0x1f) << 8) | u16::from(r.u8()?)) as i16;
            // 13-bit two's complement.
            let v = (v << 3) >> 3;
            v.to_string().into_bytes()
        } else if e & 0xF0 == 0xE0 {
            let n = ((usize::from(e & 0x0f)) << 8) | usize::from(r.u8()?);
            r.take(n)?.to_vec()
        } else {
            match e {
                0xF0 => {
                    let n = u32::from_le_bytes(r.take(4)?.try_into().expect("4")) as usize;
                    r.take(n)?.to_vec()
                }
                0xF1 => i16::from_le_bytes(r.take(2)?.try_into().expect("2"))
                    .to_string()
                    .into_bytes(),
                0xF2 => {
                    let s = r.take(3)?;
                    let v = i32::from_le_bytes([0, s[0], s[1], s[2]]) >> 8;
                    v.to_string().into_bytes()
                }
                0xF3 => i32::from_le_bytes(r.take(4)?.try_into().expect("4"))
                    .to_string()
                    .into_bytes(),
                0xF4 => i64::from_le_bytes(r.take(8)?.try_into().expect("8"))
                    .to_string()
                    .into_bytes(),
                _ => return Err(RdbError::BadFormat),
            }
        };
        // The back length: 1 to 5 bytes for the entry's size so far.
        let l = r.at - start;
        let back = match l {
            0..=127 => 1,
            128..=16382 => 2,
            16383..=2097150 => 3,
            2097151..=268435454 => 4,
            _ => 5,
        };
        r.take(back)?;
        out.push(item);
    }
}

/// The elements of a ziplist blob (Redis before 7.0).
fn ziplist(b: &[u8]) -> Res<Vec<Vec<u8>>> {
    if b.len() < 11 || u32::from_le_bytes(b[..4].try_into().expect("4")) as usize != b.len() {
        return Err(RdbError::BadFormat);
    }
    let mut r = Rd { b, at: 10 };
    let mut out = Vec::new();
    loop {
        let first = r.u8()?;
        if first == 0xFF {
            return Ok(out);
        }
        // The previous entry's length: 1 byte, or 0xFE and 4 bytes.
        if first == 0xFE {
            r.take(4)?;
        }
        let e = r.u8()?;
        let item = match e >> 6 {
            0 => r.take((e & 0x3f) as usize)?.to_vec(),
            1 => {
                let n = (usize::from(e & 0x3f) << 8) | usize::from(r.u8()?);
                r.take(n)?.to_vec()
            }
            2 => {
                let n = u32::from_be_bytes(r.take(4)?.try_into().expect("4")) as usize;
                r.take(n)?.to_vec()
            }
            _ => match e {
                0xC0 => i16::from_le_bytes(r.take(2)?.try_into().expect("2"))
                    .to_string()
                    .into_bytes(),
                0xD0 => i32::from_le_bytes(r.take(4)?.try_into().expect("4"))
                    .to_string()
                    .into_bytes(),
                0xE0 => i64::from_le_bytes(r.take(8)?.try_into().expect("8"))
                    .to_string()
                    .into_bytes(),
                0xF0 => {
                    let s = r.take(3)?;
                    (i32::from_le_bytes([0, s[0], s[1], s[2]]) >> 8)
                        .to_string()
                        .into_bytes()
                }
                0xFE => (r.u8()? as i8).to_string().into_bytes(),
                0xF1..=0xFD => ((e & 0x0f) - 1).to_string().into_bytes(),
                _ => return Err(RdbError::BadFormat),
            },
        };
        out.push(item);
    }
}

fn put_id(out: &mut Vec<u8>, id: Sid) {
    put_len(out, id.ms);
    put_len(out, id.seq);
}

/// A listpack of `items` (integers in integer encodings, strings as
/// strings), as listpack.c lays one out.
fn listpack_of(items: &[LpItem]) -> Vec<u8> {
    let mut out = vec![0u8; 6];
    for it in items {
        let start = out.len();
        match it {
            LpItem::Int(v) => {
                let v = *v;
                if (0..=127).contains(&v) {
                    out.push(v as u8);
                } else if (-4096..=4095).contains(&v) {
                    let u = (v as u16) & 0x1fff;
                    out.extend_from_slice(&[0xC0 | (u >> 8) as u8, u as u8]);
                } else if i64::from(v as i16) == v {
                    out.push(0xF1);
                    out.extend_from_slice(&(v as i16).to_le_bytes());
                } else if (-(1 << 23)..(1 << 23)).contains(&v) {
                    out.push(0xF2);
                    out.extend_from_slice(&(v as i32).to_le_bytes()[..3]);
                } else if i64::from(v as i32) == v {
                    out.push(0xF3);
                    out.extend_from_slice(&(v as i32).to_le_bytes());
                } else {
                    out.push(0xF4);
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            LpItem::Str(b) => {
                let n = b.len();
                if n < 64 {
                    out.push(0x80 | n as u8);
                } else if n < 4096 {
                    out.extend_from_slice(&[0xE0 | (n >> 8) as u8, n as u8]);
                } else {
                    out.push(0xF0);
                    out.extend_from_slice(&(n as u32).to_le_bytes());
                }
                out.extend_from_slice(b);
            }
        }
        let l = (out.len() - start) as u64;
        // The back length, for walking the listpack backwards.
        let back: Vec<u8> = if l <= 127 {
            vec![l as u8]
        } else if l < 16383 {
            vec![(l >> 7) as u8, (l & 127) as u8 | 128]
        } else if l < 2097151 {
            vec![
                (l >> 14) as u8,
                ((l >> 7) & 127) as u8 | 128,
                (l & 127) as u8 | 128,
            ]
        } else if l < 268435455 {
            vec![
                (l >> 21) as u8,
                ((l >> 14) & 127) as u8 | 128,
                ((l >> 7) & 127) as u8 | 128,
                (l & 127) as u8 | 128,
            ]
        } else {
            vec![
                (l >> 28) as u8,
                ((l >> 21) & 127) as u8 | 128,
                ((l >> 14) & 127) as u8 | 128,
                ((l >> 7) & 127) as u8 | 128,
                (l & 127) as u8 | 128,
            ]
        };
        out.extend_from_slice(&back);
    }
    out.push(0xFF);
    let total = out.len() as u32;
    out[..4].copy_from_slice(&total.to_le_bytes());
    let n = items.len().min(65535) as u16;
    out[4..6].copy_from_slice(&n.to_le_bytes());
    out
}

enum LpItem<'a> {
    Int(i64),
    Str(&'a [u8]),
}

/// A stream in RDB type 19's layout (see rdb.c's stream save).
fn dump_stream(out: &mut Vec<u8>, sv: &StreamValue) {
    let nodes: Vec<_> = sv.entries.chunks(STREAM_NODE_ENTRIES).collect();
    put_len(out, nodes.len() as u64);
    for node in &nodes {
        let master = node[0].0;
        let mfields: Vec<&[u8]> = node[0].1.iter().map(|(f, _)| f.as_slice()).collect();
        let mut items = vec![
            LpItem::Int(node.len() as i64),
            LpItem::Int(0),
            LpItem::Int(mfields.len() as i64),
        ];
        items.extend(mfields.iter().map(|f| LpItem::Str(f)));
        items.push(LpItem::Int(0));
        for (id, pairs) in node.iter() {
            let same = pairs.len() == mfields.len()
                && pairs
                    .iter()
                    .zip(&mfields)
                    .all(|((f, _), m)| f.as_slice() == *m);
            items.push(LpItem::Int(if same { STREAM_ITEM_SAMEFIELDS } else { 0 }));
            items.push(LpItem::Int(id.ms.wrapping_sub(master.ms) as i64));
            items.push(LpItem::Int(id.seq.wrapping_sub(master.seq) as i64));
            if same {
                items.extend(pairs.iter().map(|(_, v)| LpItem::Str(v)));
                items.push(LpItem::Int(pairs.len() as i64 + 3));
            } else {
                items.push(LpItem::Int(pairs.len() as i64));
                for (f, v) in pairs {
                    items.push(LpItem::Str(f));
                    items.push(LpItem::Str(v));
                }
                items.push(LpItem::Int(2 * pairs.len() as i64 + 4));
            }
        }
        put_str(out, &master.be());
        put_str(out, &listpack_of(&items));
    }
    put_len(out, sv.entries.len() as u64);
    put_id(out, sv.last);
    put_id(out, sv.first);
    put_id(out, sv.max_deleted);
    put_len(out, sv.entries_added);
    put_len(out, sv.groups.len() as u64);
    for g in &sv.groups {
        put_str(out, &g.name);
        put_id(out, g.last);
        put_len(out, g.entries_read as u64);
        put_len(out, g.pel.len() as u64);
        for (id, time, count, _) in &g.pel {
            out.extend_from_slice(&id.be());
            out.extend_from_slice(&time.to_le_bytes());
            put_len(out, *count);
        }
        put_len(out, g.consumers.len() as u64);
        for (name, seen) in &g.consumers {
            put_str(out, name);
            out.extend_from_slice(&seen.to_le_bytes());
            let own: Vec<Sid> = g.pel.iter().filter(|p| p.3 == *name).map(|p| p.0).collect();
            put_len(out, own.len() as u64);
            for id in own {
                out.extend_from_slice(&id.be());
            }
        }
    }
}

fn int_of(b: &[u8]) -> Res<i64> {
    proto::int::parse_i64(b).ok_or(RdbError::BadFormat)
}

/// A stream in RDB type 15 or 19 (`v2`).
fn load_stream<I: Input>(r: &mut I, v2: bool) -> Res<StreamValue> {
    let mut sv = StreamValue::default();
    let nodes = r.length()?;
    for _ in 0..nodes {
        let key = r.string()?;
        if key.len() != 16 {
            return Err(RdbError::BadFormat);
        }
        let master = Sid::from_be(&key).map_err(|_| RdbError::BadFormat)?;
        let el = listpack(&r.string()?)?;
        let mut it = el.iter();
        let mut next = || it.next().ok_or(RdbError::BadFormat);
        let _count = int_of(next()?)?;
        let _deleted = int_of(next()?)?;
        let nf = usize::try_from(int_of(next()?)?).map_err(|_| RdbError::BadFormat)?;
        let mut mfields = Vec::with_capacity(nf.min(1024));
        for _ in 0..nf {
            mfields.push(next()?.clone());
        }
        if int_of(next()?)? != 0 {
            return Err(RdbError::BadFormat);
        }
        while let Ok(flags) = next() {
            let flags = int_of(flags)?;
            let ms = master.ms.wrapping_add(int_of(next()?)? as u64);
            let seq = master.seq.wrapping_add(int_of(next()?)? as u64);
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = if flags & STREAM_ITEM_SAMEFIELDS != 0 {
                mfields
                    .iter()
                    .map(|f| Ok((f.clone(), next()?.clone())))
                    .collect::<Res<_>>()?
            } else {
                let n = int_of(next()?)?;
                (0..n)
                    .map(|_| Ok((next()?.clone(), next()?.clone())))
                    .collect::<Res<_>>()?
            };
            next()?;
            if flags & STREAM_ITEM_DELETED == 0 {
                let id = Sid::new(ms, seq);
                if sv.entries.last().is_some_and(|(last, _)| *last >= id) {
                    return Err(RdbError::BadFormat);
                }
                sv.entries.push((id, pairs));
            }
        }
    }
    let length = r.length()?;
    let rid = |r: &mut I| -> Res<Sid> { Ok(Sid::new(r.length()?, r.length()?)) };
    sv.last = rid(r)?;
    if v2 {
        sv.first = rid(r)?;
        sv.max_deleted = rid(r)?;
        sv.entries_added = r.length()?;
    } else {
        sv.first = sv.entries.first().map_or(Sid::MIN, |e| e.0);
        sv.entries_added = length;
    }
    if length != sv.entries.len() as u64 || sv.entries.last().is_some_and(|(id, _)| *id > sv.last) {
        return Err(RdbError::BadFormat);
    }
    let ngroups = r.length()?;
    for _ in 0..ngroups {
        let name = r.string()?;
        let last = rid(r)?;
        let entries_read = if v2 { r.length()? as i64 } else { -1 };
        let npel = r.length()?;
        let mut pel = Vec::new();
        for _ in 0..npel {
            let id = Sid::from_be(&r.array::<16>()?).map_err(|_| RdbError::BadFormat)?;
            let time = i64::from_le_bytes(r.array()?);
            let count = r.length()?;
            if pel
                .last()
                .is_some_and(|p: &(Sid, i64, u64, Vec<u8>)| p.0 >= id)
            {
                return Err(RdbError::BadFormat);
            }
            pel.push((id, time, count, Vec::new()));
        }
        let ncons = r.length()?;
        let mut consumers = Vec::new();
        for _ in 0..ncons {
            let cname = r.string()?;
            let seen = i64::from_le_bytes(r.array()?);
            let own = r.length()?;
            for _ in 0..own {
                let id = Sid::from_be(&r.array::<16>()?).map_err(|_| RdbError::BadFormat)?;
                let at = pel
                    .binary_search_by(|p: &(Sid, i64, u64, Vec<u8>)| p.0.cmp(&id))
                    .map_err(|_| RdbError::BadFormat)?;
                if !pel[at].3.is_empty() {
                    return Err(RdbError::BadFormat);
                }
                pel[at].3 = cname.clone();
            }
            consumers.push((cname, seen));
        }
        // Every pending entry belongs to a consumer.
        if pel.iter().any(|p| p.3.is_empty()) {
            return Err(RdbError::BadFormat);
        }
        sv.groups.push(GroupValue {
            name,
            last,
            entries_read,
            pel,
            consumers,
        });
    }
    Ok(sv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_is_redis_s() {
        // Redis's crc64.c test vector.
        assert_eq!(CRC64.checksum(b"123456789"), 0xe9c6d914c4b8d9ca);
    }

    #[test]
    fn dumps_restore_to_the_same_value_and_damage_is_refused() {
        let values = [
            Value::String(b"hello".to_vec()),
            Value::String(vec![0; 70_000]),
            Value::List(vec![b"a".to_vec(), b"".to_vec(), b"123".to_vec()]),
            Value::Set(vec![b"x".to_vec(), b"7".to_vec()]),
            Value::Hash(vec![(b"f".to_vec(), b"v".to_vec())]),
            Value::Zset(vec![(b"m".to_vec(), -0.5), (b"n".to_vec(), f64::INFINITY)]),
        ];
        for v in values {
            let d = dump(&v);
            assert_eq!(restore(&d).unwrap(), v);
            let mut bad = d.clone();
            bad[1] ^= 1;
            assert_eq!(restore(&bad), Err(RdbError::VersionOrChecksum));
            for cut in 0..d.len() {
                assert!(restore(&d[..cut]).is_err());
            }
        }
    }

    #[test]
    fn streams_round_trip_through_listpack_nodes() {
        let entries: Vec<_> = (1..=250u64)
            .map(|i| {
                let f: &[u8] = if i % 3 == 0 { b"other" } else { b"f" };
                (
                    Sid::new(i * 1000, i % 2),
                    vec![(f.to_vec(), vec![b'v'; (i % 200) as usize])],
                )
            })
            .collect();
        let sv = StreamValue {
            last: Sid::new(250_000, 7),
            first: entries[0].0,
            max_deleted: Sid::new(3, 0),
            entries_added: 260,
            groups: vec![GroupValue {
                name: b"g".to_vec(),
                last: Sid::new(5000, 1),
                entries_read: -1,
                pel: vec![(Sid::new(1000, 1), 123, 2, b"c".to_vec())],
                consumers: vec![(b"c".to_vec(), 99), (b"idle".to_vec(), 5)],
            }],
            entries,
        };
        let v = Value::Stream(sv);
        assert_eq!(restore(&dump(&v)).unwrap(), v);
    }

    /// A payload as redis-server 7.0.15 DUMPs it: `RPUSH l a 1 -300
    /// 70000` (a quicklist 2 node holding a listpack of a string and three
    /// integers of three encodings).
    #[test]
    fn reads_a_redis_listpack_list() {
        let mut body = vec![TYPE_LIST_QUICKLIST_2, 1, 2];
        let mut lp = vec![0, 0, 0, 0, 4, 0];
        lp.extend_from_slice(&[0x81, b'a', 2]); // 6-bit string
        lp.extend_from_slice(&[0x01, 1]); // 7-bit uint
        let v13 = (-300i16 as u16) & 0x1fff;
        lp.extend_from_slice(&[0xC0 | (v13 >> 8) as u8, v13 as u8, 2]);
        lp.extend_from_slice(&[0xF2, 0x70, 0x11, 0x01, 4]); // 24-bit int
        lp.push(0xFF);
        let n = lp.len() as u32;
        lp[..4].copy_from_slice(&n.to_le_bytes());
        put_str(&mut body, &lp);
        body.extend_from_slice(&RDB_VERSION.to_le_bytes());
        let crc = CRC64.checksum(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(
            restore(&body).unwrap(),
            Value::List(vec![
                b"a".to_vec(),
                b"1".to_vec(),
                b"-300".to_vec(),
                b"70000".to_vec()
            ])
        );
    }
}
