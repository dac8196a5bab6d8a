//! Reply values, their RESP2/RESP3 encoding, and a reply parser.

use crate::error::ProtoError;
use crate::int::parse_i64;

/// Protocol version negotiated with `HELLO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    /// RESP2 (the default for a new connection).
    #[default]
    Resp2,
    /// RESP3.
    Resp3,
}

/// A server reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+text` (a `\r` or `\n` in the text is sent as a space).
    Simple(String),
    /// `-text`, e.g. `ERR unknown command 'foo'` (`\r`/`\n` sent as spaces).
    Error(String),
    /// `:n`
    Integer(i64),
    /// `$len` + bytes.
    Bulk(Vec<u8>),
    /// RESP2 `$-1`, RESP3 `_`.
    Null,
    /// RESP2 `*-1`, RESP3 `_`.
    NullArray,
    /// `*n` + elements.
    Array(Vec<Reply>),
    /// RESP3 `%n` + key/value pairs; RESP2 a flat array of `2n` elements.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 `~n`; RESP2 an array.
    Set(Vec<Reply>),
    /// RESP3 `,` + number; RESP2 a bulk string of the same text.
    Double(f64),
    /// RESP3 `#t`/`#f`; RESP2 `:1`/`:0`.
    Boolean(bool),
    /// RESP3 `=len` + `fmt:` + text; RESP2 a bulk string of the text.
    Verbatim { format: [u8; 3], text: Vec<u8> },
    /// RESP3 `(` + digits; RESP2 a bulk string of the digits.
    BigNumber(String),
    /// RESP3 `>n` + elements; RESP2 an array.
    Push(Vec<Reply>),
}

#[inline]
fn put_line(out: &mut Vec<u8>, tag: u8, text: &[u8]) {
    out.push(tag);
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
}

#[inline]
fn put_header(out: &mut Vec<u8>, tag: u8, n: usize) {
    put_line(out, tag, itoa::Buffer::new().format(n).as_bytes());
}

/// The encoder's pieces that a server's hot path writes directly, without
/// building a [`Reply`]: the same bytes [`Reply::encode`] writes for the
/// corresponding values (it is built from them).
pub mod put {
    use super::{put_header, put_line, Version};

    /// `+OK`.
    #[inline]
    pub fn ok(out: &mut Vec<u8>) {
        out.extend_from_slice(b"+OK\r\n");
    }

    /// An integer reply.
    #[inline]
    pub fn int(out: &mut Vec<u8>, n: i64) {
        put_line(out, b':', itoa::Buffer::new().format(n).as_bytes());
    }

    /// A bulk string.
    #[inline]
    pub fn bulk(out: &mut Vec<u8>, data: &[u8]) {
        put_header(out, b'$', data.len());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }

    /// The header of an array of `n` elements (the elements follow).
    #[inline]
    pub fn array_header(out: &mut Vec<u8>, n: usize) {
        put_header(out, b'*', n);
    }

    /// The null bulk string (RESP2 `$-1`, RESP3 `_`).
    #[inline]
    pub fn null(out: &mut Vec<u8>, proto: Version) {
        out.extend_from_slice(if proto == Version::Resp3 {
            b"_\r\n"
        } else {
            b"$-1\r\n"
        });
    }
}

fn put_sanitized(out: &mut Vec<u8>, tag: u8, text: &str) {
    out.push(tag);
    out.extend(
        text.bytes()
            .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

/// Formats a double as Redis 7.0's `addReplyDouble` does: `inf`, `-inf`,
/// `nan`, else C's `%.17g` (17 significant digits, so every double reads
/// back exactly: `0.1` is `0.10000000000000001`, `3.0` is `3`, `1e17` is
/// `1e+17`).
pub fn format_double(d: f64) -> String {
    if d.is_nan() {
        return "nan".into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "inf".into() } else { "-inf".into() };
    }
    format_g17(d)
}

/// Redis's `d2string` (how sorted-set scores are written as strings, e.g.
/// by ZSCAN): integral values within ±2^62 as integers (`-0` for negative
/// zero), everything else as [`format_double`].
pub fn d2string(d: f64) -> String {
    if d == 0.0 {
        return if d.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    const LIMIT: f64 = (i64::MAX / 2) as f64;
    if d.is_finite() && d.fract() == 0.0 && (-LIMIT..=LIMIT).contains(&d) {
        return format!("{}", d as i64);
    }
    format_double(d)
}

/// C's `%.17g` of a finite double: the exponent X of the value rounded to 17
/// significant digits picks the style (plain with 16 - X decimals when
/// -4 <= X < 17, else `d.ddde±XX`), then trailing zeros and a trailing point
/// go. Rust's float formatting is exact, as glibc's is.
fn format_g17(d: f64) -> String {
    let sci = format!("{d:.16e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if (-4..17).contains(&exp) {
        trim(&format!("{:.*}", (16 - exp) as usize, d))
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.unsigned_abs())
    }
}

impl Reply {
    /// Shorthand for `Reply::Simple("OK")`.
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// Appends the wire form of this reply in protocol `proto` to `out`.
    pub fn encode(&self, proto: Version, out: &mut Vec<u8>) {
        let v3 = proto == Version::Resp3;
        match self {
            Reply::Simple(s) => put_sanitized(out, b'+', s),
            Reply::Error(s) => put_sanitized(out, b'-', s),
            Reply::Integer(n) => put::int(out, *n),
            Reply::Bulk(b) => put::bulk(out, b),
            Reply::Null => put::null(out, proto),
            Reply::NullArray if v3 => out.extend_from_slice(b"_\r\n"),
            Reply::NullArray => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(items) => Self::encode_seq(b'*', items, proto, out),
            Reply::Set(items) => Self::encode_seq(if v3 { b'~' } else { b'*' }, items, proto, out),
            Reply::Push(items) => Self::encode_seq(if v3 { b'>' } else { b'*' }, items, proto, out),
            Reply::Map(pairs) => {
                if v3 {
                    put_header(out, b'%', pairs.len());
                } else {
                    put_header(out, b'*', pairs.len() * 2);
                }
                for (k, v) in pairs {
                    k.encode(proto, out);
                    v.encode(proto, out);
                }
            }
            Reply::Double(d) => {
                let s = format_double(*d);
                if v3 {
                    put_line(out, b',', s.as_bytes());
                } else {
                    put::bulk(out, s.as_bytes());
                }
            }
            Reply::Boolean(b) if v3 => {
                out.extend_from_slice(if *b { b"#t\r\n" } else { b"#f\r\n" })
            }
            Reply::Boolean(b) => out.extend_from_slice(if *b { b":1\r\n" } else { b":0\r\n" }),
            Reply::Verbatim { format, text } if v3 => {
                put_header(out, b'=', text.len() + 4);
                out.extend_from_slice(format);
                out.push(b':');
                out.extend_from_slice(text);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Verbatim { text, .. } => put::bulk(out, text),
            Reply::BigNumber(s) if v3 => put_sanitized(out, b'(', s),
            Reply::BigNumber(s) => put::bulk(out, s.as_bytes()),
        }
    }

    fn encode_seq(tag: u8, items: &[Reply], proto: Version, out: &mut Vec<u8>) {
        put_header(out, tag, items.len());
        for item in items {
            item.encode(proto, out);
        }
    }

    /// Convenience: the encoding as a fresh vector.
    pub fn to_bytes(&self, proto: Version) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(proto, &mut out);
        out
    }
}

/// Deepest aggregate nesting the reply parser accepts.
pub const MAX_REPLY_DEPTH: usize = 256;
/// Most elements reserved for an aggregate before they have arrived.
const RESERVE_CAP: usize = 64;

/// Parses one RESP2 or RESP3 reply from the front of `buf`.
///
/// `Ok(None)` means more bytes are needed; `Ok(Some((reply, consumed)))` gives
/// the reply and its length in bytes. RESP2 `$-1` parses as [`Reply::Null`],
/// `*-1` as [`Reply::NullArray`], RESP3 `_` as [`Reply::Null`]. A RESP3 blob
/// error `!` parses as [`Reply::Error`]; attributes `|` are read and
/// discarded. Streamed (`?`-length) aggregates and strings are not supported.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtoError> {
    parse_at(buf, 0, 0)
}

type Step = Result<Option<(Reply, usize)>, ProtoError>;

/// Returns the line starting at `pos` (without its tag byte handling) and the
/// position after its `\r\n`.
fn line(buf: &[u8], pos: usize) -> Result<Option<(&[u8], usize)>, ProtoError> {
    let rest = &buf[pos..];
    let Some(cr) = rest.iter().position(|&b| b == b'\r') else {
        return Ok(None);
    };
    match rest.get(cr + 1) {
        None => Ok(None),
        Some(b'\n') => Ok(Some((&rest[..cr], pos + cr + 2))),
        Some(_) => Err(ProtoError::BadReply("expected CRLF")),
    }
}

fn int(text: &[u8]) -> Result<i64, ProtoError> {
    parse_i64(text).ok_or(ProtoError::BadReply("invalid integer"))
}

fn length(text: &[u8]) -> Result<Option<usize>, ProtoError> {
    match int(text)? {
        -1 => Ok(None),
        n if n >= 0 => usize::try_from(n)
            .map(Some)
            .map_err(|_| ProtoError::BadReply("invalid length")),
        _ => Err(ProtoError::BadReply("invalid length")),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Reads a length-prefixed blob whose payload starts at `pos`.
fn blob(buf: &[u8], pos: usize, len: usize) -> Result<Option<(&[u8], usize)>, ProtoError> {
    let avail = buf.len() - pos;
    if avail < len.saturating_add(2) {
        return Ok(None);
    }
    if &buf[pos + len..pos + len + 2] != b"\r\n" {
        return Err(ProtoError::BadReply("expected CRLF after blob"));
    }
    Ok(Some((&buf[pos..pos + len], pos + len + 2)))
}

fn seq(
    buf: &[u8],
    mut pos: usize,
    n: usize,
    depth: usize,
) -> Result<Option<(Vec<Reply>, usize)>, ProtoError> {
    let mut items = Vec::with_capacity(n.min(RESERVE_CAP));
    for _ in 0..n {
        match parse_at(buf, pos, depth + 1)? {
            Some((r, next)) => {
                items.push(r);
                pos = next;
            }
            None => return Ok(None),
        }
    }
    Ok(Some((items, pos)))
}

fn parse_at(buf: &[u8], pos: usize, depth: usize) -> Step {
    if depth > MAX_REPLY_DEPTH {
        return Err(ProtoError::BadReply("reply nested too deeply"));
    }
    let Some(&tag) = buf.get(pos) else {
        return Ok(None);
    };
    let Some((head, after)) = line(buf, pos + 1)? else {
        return Ok(None);
    };
    let reply = match tag {
        b'+' => Reply::Simple(text(head)),
        b'-' => Reply::Error(text(head)),
        b':' => Reply::Integer(int(head)?),
        b'_' if head.is_empty() => Reply::Null,
        b'#' => match head {
            b"t" => Reply::Boolean(true),
            b"f" => Reply::Boolean(false),
            _ => return Err(ProtoError::BadReply("invalid boolean")),
        },
        b',' => {
            let s =
                std::str::from_utf8(head).map_err(|_| ProtoError::BadReply("invalid double"))?;
            Reply::Double(
                s.parse()
                    .map_err(|_| ProtoError::BadReply("invalid double"))?,
            )
        }
        b'(' => {
            let digits = head.strip_prefix(b"-").unwrap_or(head);
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return Err(ProtoError::BadReply("invalid big number"));
            }
            Reply::BigNumber(text(head))
        }
        b'$' | b'!' | b'=' => {
            let Some(len) = length(head)? else {
                return if tag == b'$' {
                    Ok(Some((Reply::Null, after)))
                } else {
                    Err(ProtoError::BadReply("invalid length"))
                };
            };
            let Some((data, next)) = blob(buf, after, len)? else {
                return Ok(None);
            };
            let reply = match tag {
                b'$' => Reply::Bulk(data.to_vec()),
                b'!' => Reply::Error(text(data)),
                _ => {
                    if data.len() < 4 || data[3] != b':' {
                        return Err(ProtoError::BadReply("invalid verbatim string"));
                    }
                    Reply::Verbatim {
                        format: [data[0], data[1], data[2]],
                        text: data[4..].to_vec(),
                    }
                }
            };
            return Ok(Some((reply, next)));
        }
        b'*' | b'~' | b'>' => {
            let Some(n) = length(head)? else {
                return if tag == b'*' {
                    Ok(Some((Reply::NullArray, after)))
                } else {
                    Err(ProtoError::BadReply("invalid length"))
                };
            };
            let Some((items, next)) = seq(buf, after, n, depth)? else {
                return Ok(None);
            };
            let reply = match tag {
                b'*' => Reply::Array(items),
                b'~' => Reply::Set(items),
                _ => Reply::Push(items),
            };
            return Ok(Some((reply, next)));
        }
        b'%' | b'|' => {
            let n = length(head)?.ok_or(ProtoError::BadReply("invalid length"))?;
            let Some(n2) = n.checked_mul(2) else {
                return Err(ProtoError::BadReply("invalid length"));
            };
            let Some((items, next)) = seq(buf, after, n2, depth)? else {
                return Ok(None);
            };
            if tag == b'|' {
                // Attributes describe the reply that follows: skip them.
                return parse_at(buf, next, depth + 1);
            }
            let mut pairs = Vec::with_capacity(n);
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                pairs.push((k, v));
            }
            return Ok(Some((Reply::Map(pairs), next)));
        }
        _ => return Err(ProtoError::BadReply("unknown reply type")),
    };
    Ok(Some((reply, after)))
}
