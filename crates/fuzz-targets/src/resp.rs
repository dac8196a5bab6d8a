//! The `resp` target: proto's request framer (multibulk and inline), fed in
//! reads of sizes the input chooses, and proto's reply encoder and parser.
//!
//! The input's first byte picks the limits (Redis's defaults, or tiny ones
//! that the size errors can be reached with), the next four bytes the sizes
//! of the reads, cycled; the rest is what the client sends. Checked:
//!
//! - read by read, [`RespCodec::decode`] (which skips parsing while its
//!   resume state says the request is still incomplete) answers exactly what
//!   the stateless [`parse_request`] answers on the same buffer, and a
//!   complete request consumes at least one byte and at most the buffer;
//! - the requests decoded read by read are those decoded from the whole
//!   input at once, and they end the same way (the same protocol error, or
//!   the same bytes left over), except that a size limit on bytes pending
//!   without a terminator may stop the read-by-read decode earlier (Redis's
//!   limits are on what has arrived);
//! - [`peek_requests`] on the whole input sees a prefix of the requests the
//!   parser decodes (names and first arguments);
//! - the reply parser on the same bytes returns, and a reply it parsed is a
//!   fixed point of encode → parse → encode in RESP2 and RESP3;
//! - a reply built from the input (every type, nested) encodes in RESP2 and
//!   RESP3 to bytes the parser reads back whole and that re-encode to the
//!   same bytes.

use arbitrary::Unstructured;
use proto::{
    parse_reply, parse_request, peek_requests, Args, Codec, Limits, Parsed, ProtoError, Reply,
    RespCodec, Version,
};

/// The `resp` target (see the module documentation).
pub fn resp(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (reads, stream) = rest.split_at(rest.len().min(4));
    let limits = if mode & 1 == 0 {
        Limits::default()
    } else {
        Limits {
            max_bulk_len: 32,
            max_multibulk_len: 8,
            max_inline_len: 32,
            max_query_buffer: 256,
        }
    };
    let whole = decode_whole(stream, &limits);
    let chunked = decode_chunked(stream, reads, &limits);
    compare(&whole, &chunked, stream);
    if mode & 1 == 0 {
        check_peek(stream, &whole.frames);
    }
    check_reply_parser(stream);
    let mut u = Unstructured::new(stream);
    let r = gen_reply(&mut u, 0);
    for v in [Version::Resp2, Version::Resp3] {
        round_trip(&r, v);
    }
}

/// What a decode found: the requests, how it ended, and the bytes left.
struct Decoded {
    frames: Vec<Vec<Vec<u8>>>,
    end: Result<(), ProtoError>,
    left: Vec<u8>,
}

/// One decode call, checked against the stateless parser on the same bytes.
/// Returns the bytes consumed by a complete request.
fn step(
    codec: &mut RespCodec,
    buf: &[u8],
    limits: &Limits,
    args: &mut Args,
) -> Result<Option<usize>, ProtoError> {
    let r = codec.decode(buf, limits, args);
    let reference = parse_request(buf, limits);
    match &r {
        Ok(Some(n)) => {
            assert!(
                *n > 0 && *n <= buf.len(),
                "consumed {n} of {} bytes",
                buf.len()
            );
            assert_eq!(
                reference,
                Parsed::Complete {
                    args: args.as_slice().to_vec(),
                    consumed: *n
                },
                "codec and parser disagree"
            );
        }
        Ok(None) => assert_eq!(
            reference,
            Parsed::Incomplete,
            "the codec waits for more where the parser does not"
        ),
        Err(e) => assert_eq!(
            reference,
            Parsed::Error(e.clone()),
            "codec and parser disagree"
        ),
    }
    r
}

fn decode_whole(stream: &[u8], limits: &Limits) -> Decoded {
    let mut codec = RespCodec::default();
    let mut args = Args::default();
    let mut frames = Vec::new();
    let mut pos = 0;
    let end = loop {
        match step(&mut codec, &stream[pos..], limits, &mut args) {
            Ok(Some(n)) => {
                frames.push(args.as_slice().to_vec());
                pos += n;
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    Decoded {
        frames,
        end,
        left: stream[pos..].to_vec(),
    }
}

/// Decodes `stream` as a connection receives it, in reads whose sizes come
/// from `reads` (cycled): each read is appended to the buffer and the codec
/// is called until it needs more, as a worker does.
fn decode_chunked(stream: &[u8], reads: &[u8], limits: &Limits) -> Decoded {
    let mut codec = RespCodec::default();
    let mut args = Args::default();
    let mut frames = Vec::new();
    let mut buf = Vec::new();
    let mut fed = 0;
    let mut k = 0;
    let mut end = Ok(());
    'reads: while fed < stream.len() {
        let size = match reads.get(k % reads.len().max(1)).copied().unwrap_or(0) {
            0 => stream.len(),
            s @ 1..=199 => usize::from(s % 16) + 1,
            s => usize::from(s - 199) * 64,
        };
        k += 1;
        let to = (fed + size).min(stream.len());
        buf.extend_from_slice(&stream[fed..to]);
        fed = to;
        loop {
            match step(&mut codec, &buf, limits, &mut args) {
                Ok(Some(n)) => {
                    frames.push(args.as_slice().to_vec());
                    buf.drain(..n);
                }
                Ok(None) => break,
                Err(e) => {
                    end = Err(e);
                    break 'reads;
                }
            }
        }
    }
    Decoded {
        frames,
        end,
        left: buf,
    }
}

/// Errors that depend on how much of a request has arrived (bytes pending
/// without a terminator), not only on the bytes themselves.
fn depends_on_reads(e: &ProtoError) -> bool {
    matches!(
        e,
        ProtoError::TooBigInline
            | ProtoError::TooBigMbulkCount
            | ProtoError::TooBigBulkCount
            | ProtoError::QueryBufferLimit
    )
}

fn compare(whole: &Decoded, chunked: &Decoded, stream: &[u8]) {
    match &chunked.end {
        Err(e) if depends_on_reads(e) => assert!(
            whole.frames.starts_with(&chunked.frames),
            "read by read, {} requests then {e:?}; at once, {} requests not starting with them",
            chunked.frames.len(),
            whole.frames.len()
        ),
        end => {
            assert_eq!(
                chunked.frames,
                whole.frames,
                "read by read and at once decode different requests from {:?}",
                String::from_utf8_lossy(stream)
            );
            assert_eq!(end, &whole.end, "read by read and at once end differently");
            if end.is_ok() {
                assert_eq!(chunked.left, whole.left);
            }
        }
    }
}

fn check_peek(stream: &[u8], frames: &[Vec<Vec<u8>>]) {
    let mut seen: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
    let n = peek_requests(stream, usize::MAX, |first, second| {
        seen.push((first.to_vec(), second.map(<[u8]>::to_vec)))
    });
    assert_eq!(n, seen.len());
    // Empty requests (`*0`) are skipped by both.
    let parsed: Vec<_> = frames
        .iter()
        .filter(|f| !f.is_empty())
        .map(|f| (f[0].clone(), f.get(1).cloned()))
        .collect();
    assert!(
        parsed.starts_with(&seen),
        "peek_requests saw requests the parser did not decode"
    );
}

fn check_reply_parser(bytes: &[u8]) {
    let Ok(Some((r, n))) = parse_reply(bytes) else {
        return;
    };
    assert!(
        n > 0 && n <= bytes.len(),
        "reply consumed {n} of {}",
        bytes.len()
    );
    for v in [Version::Resp2, Version::Resp3] {
        round_trip(&r, v);
    }
}

/// `r` encoded in `v` parses back whole to a reply that encodes to the same
/// bytes.
fn round_trip(r: &Reply, v: Version) {
    let bytes = r.to_bytes(v);
    match parse_reply(&bytes) {
        Ok(Some((back, n))) => {
            assert_eq!(n, bytes.len(), "{v:?}: the parser stopped short in {r:?}");
            assert_eq!(
                back.to_bytes(v),
                bytes,
                "{v:?}: {r:?} encoded, parsed and encoded again differs"
            );
        }
        other => panic!("{v:?}: {r:?} encoded to bytes the parser refuses: {other:?}"),
    }
}

/// Aggregates nest at most this deep in a generated reply.
const MAX_DEPTH: usize = 4;

fn gen_text(u: &mut Unstructured) -> String {
    let n = u.int_in_range(0..=12).unwrap_or(0);
    let bytes = u.bytes(n).unwrap_or_default();
    String::from_utf8_lossy(bytes).into_owned()
}

fn gen_items(u: &mut Unstructured, depth: usize) -> Vec<Reply> {
    let n = u.int_in_range(0..=4).unwrap_or(0);
    (0..n).map(|_| gen_reply(u, depth + 1)).collect()
}

/// A reply of any type, built from the input.
fn gen_reply(u: &mut Unstructured, depth: usize) -> Reply {
    let kinds = if depth >= MAX_DEPTH { 10 } else { 15 };
    let k: u8 = u.int_in_range(0..=kinds - 1).unwrap_or(0);
    match k {
        0 => Reply::Simple(gen_text(u)),
        1 => Reply::Error(gen_text(u)),
        2 => Reply::Integer(u.arbitrary().unwrap_or(0)),
        3 => {
            let n = u.int_in_range(0..=40).unwrap_or(0);
            Reply::Bulk(u.bytes(n).unwrap_or_default().to_vec())
        }
        4 => Reply::Null,
        5 => Reply::NullArray,
        6 => Reply::Double(f64::from_bits(u.arbitrary().unwrap_or(0))),
        7 => Reply::Boolean(u.arbitrary().unwrap_or(false)),
        8 => Reply::Verbatim {
            format: u.arbitrary().unwrap_or(*b"txt"),
            text: gen_text(u).into_bytes(),
        },
        9 => {
            let n: i128 = u.arbitrary().unwrap_or(0);
            Reply::BigNumber(n.to_string())
        }
        10 => Reply::Array(gen_items(u, depth)),
        11 => Reply::Set(gen_items(u, depth)),
        12 => Reply::Push(gen_items(u, depth)),
        13 => {
            let n = u.int_in_range(0..=3).unwrap_or(0);
            Reply::Map(
                (0..n)
                    .map(|_| (gen_reply(u, depth + 1), gen_reply(u, depth + 1)))
                    .collect(),
            )
        }
        _ => Reply::Array(vec![Reply::NullArray, Reply::Null]),
    }
}
