//! Incremental request parser (multibulk and inline), following Redis's
//! `processMultibulkBuffer` / `processInlineBuffer` semantics.
//!
//! The parser is stateless: it looks at the bytes received so far and reports
//! one complete request, `Incomplete`, or an error. On `Incomplete` the caller
//! keeps the bytes, reads more and calls again. Nothing is allocated for the
//! request's arguments until every byte of the request has arrived, so a
//! client announcing a huge bulk and then sending nothing costs nothing.

use crate::error::ProtoError;
use crate::int::parse_i64;

/// `PROTO_INLINE_MAX_SIZE` in Redis.
pub const DEFAULT_MAX_INLINE_LEN: usize = 64 * 1024;
/// `proto-max-bulk-len` default (512 MiB).
pub const DEFAULT_MAX_BULK_LEN: usize = 512 * 1024 * 1024;
/// Redis refuses a multibulk count above `INT_MAX`.
pub const DEFAULT_MAX_MULTIBULK_LEN: usize = i32::MAX as usize;
/// `client-query-buffer-limit` default (1 GiB).
pub const DEFAULT_MAX_QUERY_BUFFER: usize = 1024 * 1024 * 1024;

/// Limits applied while parsing requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted `$` length (`proto-max-bulk-len`). A larger one is
    /// `Protocol error: invalid bulk length`.
    pub max_bulk_len: usize,
    /// Largest accepted `*` count. A larger one is
    /// `Protocol error: invalid multibulk length`.
    pub max_multibulk_len: usize,
    /// Longest inline request line, and longest pending `*`/`$` header line,
    /// without a terminator (`PROTO_INLINE_MAX_SIZE`).
    pub max_inline_len: usize,
    /// Largest incomplete request that may be buffered
    /// (`client-query-buffer-limit`).
    pub max_query_buffer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_len: DEFAULT_MAX_BULK_LEN,
            max_multibulk_len: DEFAULT_MAX_MULTIBULK_LEN,
            max_inline_len: DEFAULT_MAX_INLINE_LEN,
            max_query_buffer: DEFAULT_MAX_QUERY_BUFFER,
        }
    }
}

/// The outcome of [`parse_request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// One request was parsed from the front of the buffer; `consumed` bytes
    /// must be dropped before the next call. `args` is empty for an empty
    /// request (`*0`, `*-1`, or an empty inline line): skip it.
    Complete { args: Vec<Vec<u8>>, consumed: usize },
    /// More bytes are needed.
    Incomplete,
    /// The request is malformed; Redis replies `-ERR <error>` and closes the
    /// connection.
    Error(ProtoError),
}

/// The arguments of the last request [`parse_request_into`] parsed, in slots
/// whose allocations are kept for the next request (a server parsing millions
/// of requests a second allocates nothing per argument in the steady state).
#[derive(Debug, Default)]
pub struct Args {
    slots: Vec<Vec<u8>>,
    len: usize,
}

/// Slots whose capacity exceeds this are freed rather than kept for reuse.
const KEEP_SLOT: usize = 64 * 1024;
/// Slots kept beyond the current request's count.
const KEEP_SLOTS: usize = 64;

impl Args {
    /// The arguments (empty for an empty request).
    #[inline]
    pub fn as_slice(&self) -> &[Vec<u8>] {
        &self.slots[..self.len]
    }

    fn clear(&mut self) {
        self.len = 0;
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.len == self.slots.len() {
            self.slots.push(Vec::new());
        }
        let slot = &mut self.slots[self.len];
        if slot.capacity() > KEEP_SLOT {
            *slot = Vec::new();
        }
        slot.clear();
        slot.extend_from_slice(bytes);
        self.len += 1;
    }

    /// Gives back the memory of slots no request is using: any slot past
    /// [`KEEP_SLOTS`] and any large one.
    pub fn trim(&mut self) {
        self.slots.truncate(self.len.max(KEEP_SLOTS));
        for s in &mut self.slots[self.len..] {
            if s.capacity() > KEEP_SLOT {
                *s = Vec::new();
            }
        }
    }
}

/// Parses the first request in `buf` into `args`: `Ok(Some(consumed))` when
/// a whole request was there (`args` holds it, empty for an empty request;
/// drop `consumed` bytes before the next call), `Ok(None)` when more bytes are
/// needed (`args` is then empty), or the protocol error.
pub fn parse_request_into(
    buf: &[u8],
    limits: &Limits,
    args: &mut Args,
) -> Result<Option<usize>, ProtoError> {
    args.clear();
    let parsed = if buf.first() == Some(&b'*') {
        parse_multibulk(buf, limits, args)
    } else {
        parse_inline(buf, limits, args)
    };
    match parsed {
        Ok(None) if buf.len() > limits.max_query_buffer => Err(ProtoError::QueryBufferLimit),
        other => {
            if !matches!(other, Ok(Some(_))) {
                args.clear();
            }
            other
        }
    }
}

/// Parses the first request in `buf` (allocating its arguments; a server
/// reuses an [`Args`] with [`parse_request_into`] instead).
pub fn parse_request(buf: &[u8], limits: &Limits) -> Parsed {
    let mut args = Args::default();
    match parse_request_into(buf, limits, &mut args) {
        Ok(Some(consumed)) => {
            let n = args.len;
            args.slots.truncate(n);
            Parsed::Complete {
                args: args.slots,
                consumed,
            }
        }
        Ok(None) => Parsed::Incomplete,
        Err(e) => Parsed::Error(e),
    }
}

/// Looks ahead over the complete multibulk requests at the front of `buf`
/// without copying or validating them against any limit, and calls `f` with
/// each one's first two arguments (the command name and, when there is one,
/// the argument after it: for most commands, the key). Stops after `max`
/// requests, at the first incomplete one, at an inline request and at
/// anything malformed (the real parse, [`parse_request_into`], reports it).
/// Returns how many requests `f` saw. A server uses it to start fetching the
/// keys of a pipeline from memory before it executes the first request.
pub fn peek_requests(buf: &[u8], max: usize, mut f: impl FnMut(&[u8], Option<&[u8]>)) -> usize {
    peek_request_args(buf, max, |args| {
        f(
            args.first().copied().unwrap_or_default(),
            args.get(1).copied(),
        )
    })
}

/// How many leading arguments [`peek_request_args`] shows of a request.
pub const PEEK_ARGS: usize = 8;

/// [`peek_requests`], showing `f` each request's first [`PEEK_ARGS`]
/// arguments (fewer when it has fewer): enough for the keys of a script
/// call (`EVALSHA sha numkeys key...`).
pub fn peek_request_args(buf: &[u8], max: usize, mut f: impl FnMut(&[&[u8]])) -> usize {
    // The number at the start of `rest` ("<n>\r\n"): its value and the bytes
    // the line takes.
    fn line_number(rest: &[u8]) -> Option<(i64, usize)> {
        let cr = find(b'\r', &rest[..rest.len().min(24)])?;
        if cr + 2 > rest.len() {
            return None;
        }
        Some((parse_i64(&rest[1..cr])?, cr + 2))
    }
    let mut pos = 0;
    let mut seen = 0;
    while seen < max && buf.get(pos) == Some(&b'*') {
        let Some((count, used)) = line_number(&buf[pos..]) else {
            break;
        };
        let mut p = pos + used;
        if count <= 0 {
            pos = p;
            continue;
        }
        let mut shown: [&[u8]; PEEK_ARGS] = [&[]; PEEK_ARGS];
        let mut complete = true;
        for i in 0..count {
            if buf.get(p) != Some(&b'$') {
                complete = false;
                break;
            }
            let Some((len, used)) = line_number(&buf[p..]) else {
                complete = false;
                break;
            };
            let Ok(len) = usize::try_from(len) else {
                complete = false;
                break;
            };
            p += used;
            if buf.len() - p < len.saturating_add(2) {
                complete = false;
                break;
            }
            if let Some(slot) = usize::try_from(i).ok().and_then(|i| shown.get_mut(i)) {
                *slot = &buf[p..p + len];
            }
            p += len + 2;
        }
        if !complete {
            break;
        }
        let n = usize::try_from(count).map_or(PEEK_ARGS, |c| c.min(PEEK_ARGS));
        f(&shown[..n]);
        seen += 1;
        pos = p;
    }
    seen
}

fn find(byte: u8, buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == byte)
}

fn parse_multibulk(
    buf: &[u8],
    limits: &Limits,
    args: &mut Args,
) -> Result<Option<usize>, ProtoError> {
    // Count line: "*<n>\r\n". Like Redis, the byte after '\r' is not checked.
    let Some(cr) = find(b'\r', buf) else {
        return if buf.len() > limits.max_inline_len {
            Err(ProtoError::TooBigMbulkCount)
        } else {
            Ok(None)
        };
    };
    if cr + 2 > buf.len() {
        return Ok(None);
    }
    let count = match parse_i64(&buf[1..cr]) {
        Some(n) if n <= 0 => return Ok(Some(cr + 2)),
        Some(n) if (n as u64) <= limits.max_multibulk_len as u64 => n as usize,
        _ => return Err(ProtoError::InvalidMultibulkLength),
    };
    let mut pos = cr + 2;
    // Arguments are copied out only once the whole request is there: first
    // walk it, then copy (a huge announced count or length costs nothing).
    let first = pos;
    for _ in 0..count {
        let rest = &buf[pos..];
        let Some(cr) = find(b'\r', rest) else {
            return if rest.len() > limits.max_inline_len {
                Err(ProtoError::TooBigBulkCount)
            } else {
                Ok(None)
            };
        };
        if cr + 2 > rest.len() {
            return Ok(None);
        }
        if rest[0] != b'$' {
            return Err(ProtoError::ExpectedDollar(rest[0]));
        }
        let len = match parse_i64(&rest[1..cr]) {
            Some(n) if n >= 0 && (n as u64) <= limits.max_bulk_len as u64 => n as usize,
            _ => return Err(ProtoError::InvalidBulkLength),
        };
        pos += cr + 2;
        // Payload plus its trailing two bytes (skipped unchecked, as Redis does).
        if buf.len() - pos < len.saturating_add(2) {
            return Ok(None);
        }
        pos += len + 2;
    }
    // Second pass over the now complete (and validated) request.
    let mut p = first;
    for _ in 0..count {
        let cr = find(b'\r', &buf[p..]).expect("validated above");
        let len = parse_i64(&buf[p + 1..p + cr]).expect("validated above") as usize;
        p += cr + 2;
        args.push(&buf[p..p + len]);
        p += len + 2;
    }
    debug_assert_eq!(p, pos);
    Ok(Some(pos))
}

fn parse_inline(buf: &[u8], limits: &Limits, args: &mut Args) -> Result<Option<usize>, ProtoError> {
    let Some(nl) = find(b'\n', buf) else {
        return if buf.len() > limits.max_inline_len {
            Err(ProtoError::TooBigInline)
        } else {
            Ok(None)
        };
    };
    let end = if nl > 0 && buf[nl - 1] == b'\r' {
        nl - 1
    } else {
        nl
    };
    match split_args(&buf[..end]) {
        Some(v) => {
            for a in &v {
                args.push(a);
            }
            Ok(Some(nl + 1))
        }
        None => Err(ProtoError::UnbalancedQuotes),
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// C `isspace`.
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Splits an inline line into arguments with Redis's `sdssplitargs` rules.
/// `None` means unbalanced quotes. The end of the slice plays the part of the
/// C string's NUL; a NUL byte inside the line is an ordinary byte here.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut args = Vec::new();
    let mut p = 0;
    loop {
        while p < line.len() && is_space(line[p]) {
            p += 1;
        }
        if p >= line.len() {
            return Some(args);
        }
        let mut cur = Vec::new();
        let mut in_dq = false;
        let mut in_sq = false;
        loop {
            let c = line.get(p).copied();
            let next = line.get(p + 1).copied();
            if in_dq {
                match c {
                    None => return None,
                    Some(b'\\') if next == Some(b'x') => {
                        let h = line.get(p + 2).copied().and_then(hex_val);
                        let l = line.get(p + 3).copied().and_then(hex_val);
                        if let (Some(h), Some(l)) = (h, l) {
                            cur.push(h * 16 + l);
                            p += 3;
                        } else {
                            cur.push(b'x');
                            p += 1;
                        }
                    }
                    Some(b'\\') if next.is_some() => {
                        let n = next.unwrap_or_default();
                        cur.push(match n {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                        p += 1;
                    }
                    Some(b'"') => {
                        if next.is_some_and(|n| !is_space(n)) {
                            return None;
                        }
                        p += 1;
                        break;
                    }
                    Some(other) => cur.push(other),
                }
            } else if in_sq {
                match c {
                    None => return None,
                    Some(b'\\') if next == Some(b'\'') => {
                        cur.push(b'\'');
                        p += 1;
                    }
                    Some(b'\'') => {
                        if next.is_some_and(|n| !is_space(n)) {
                            return None;
                        }
                        p += 1;
                        break;
                    }
                    Some(other) => cur.push(other),
                }
            } else {
                match c {
                    None | Some(b' ' | b'\n' | b'\r' | b'\t') => break,
                    Some(b'"') => in_dq = true,
                    Some(b'\'') => in_sq = true,
                    Some(other) => cur.push(other),
                }
            }
            p += 1;
        }
        args.push(cur);
    }
}

/// Encodes `args` as a multibulk request (what a client sends).
pub fn encode_request<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        let a = a.as_ref();
        out.push(b'$');
        out.extend_from_slice(a.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}
