//! The per-connection side of a protocol: a [`Codec`] turns the bytes a
//! connection received into requests, one at a time, keeping whatever it
//! learnt about a request that has not fully arrived.
//!
//! A server holds one codec per connection and calls [`Codec::decode`] with
//! the unconsumed input, starting at the first byte of the next request.
//! [`RespCodec`] is Redis's protocol (multibulk and inline requests); another
//! protocol (memcached's text protocol) is another implementation of the same
//! trait, feeding the same argument vector to its own command table.

use crate::error::ProtoError;
use crate::int::parse_u64;
use crate::parse::{parse_request_into, Args, Limits};

/// Frames requests out of a connection's input.
pub trait Codec {
    /// Decodes the request at the front of `buf` into `args`:
    /// `Ok(Some(consumed))` when it is complete (drop `consumed` bytes before
    /// the next call; `args` is empty for an empty request, which is skipped),
    /// `Ok(None)` when more bytes are needed (call again with the same
    /// request's bytes at the front of `buf`, and more after them), or the
    /// protocol error (the connection is then answered and closed).
    fn decode(
        &mut self,
        buf: &[u8],
        limits: &Limits,
        args: &mut Args,
    ) -> Result<Option<usize>, ProtoError>;

    /// Forgets a partly received request: its bytes were dropped.
    fn reset(&mut self);
}

/// Redis's protocol: [`parse_request_into`], plus a [`Resume`] that keeps a
/// large request arriving in many reads from being parsed from its first byte
/// at every read.
#[derive(Debug, Default)]
pub struct RespCodec {
    resume: Resume,
}

impl Codec for RespCodec {
    #[inline]
    fn decode(
        &mut self,
        buf: &[u8],
        limits: &Limits,
        args: &mut Args,
    ) -> Result<Option<usize>, ProtoError> {
        if self.resume.active && !self.resume.advance(buf, limits) {
            // Still incomplete: not worth a full parse.
            return Ok(None);
        }
        self.resume = Resume::default();
        let r = parse_request_into(buf, limits, args);
        if let Ok(None) = r {
            // Track the request from here on, so that each read costs what it
            // brought, not a parse of all that came before it.
            self.resume = Resume::start(buf, limits);
        }
        r
    }

    fn reset(&mut self) {
        self.resume = Resume::default();
    }
}

/// How far an incomplete multibulk request has been walked.
///
/// The parser is stateless: every call on an incomplete request starts over
/// from its first byte. A request of many arguments arriving in many reads
/// would be re-parsed once per read, quadratic in its size. `Resume` walks
/// the frame structure incrementally, as far as the bytes go, and says when
/// the parser might have something other than "incomplete" to say: the
/// request looks complete, or something in it is not plainly well-formed (the
/// parser then reports the error with its exact text). It only decides when
/// to parse, never what a request means, and it errs towards parsing:
/// whenever it reports "still incomplete", [`parse_request_into`] would too
/// (a unit test checks this on every prefix of a set of requests).
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct Resume {
    active: bool,
    /// Arguments not yet complete.
    args_left: usize,
    /// Offset (from the request's start) of the first incomplete argument.
    pos: usize,
}

impl Resume {
    /// Starts tracking the request at the front of `buf`, which the parser
    /// found incomplete. Inactive unless it is a multibulk request whose
    /// count line is complete and positive.
    fn start(buf: &[u8], limits: &Limits) -> Resume {
        if buf.first() != Some(&b'*') {
            return Resume::default();
        }
        let Some(cr) = buf.iter().position(|&b| b == b'\r') else {
            return Resume::default();
        };
        if cr + 2 > buf.len() {
            return Resume::default();
        }
        let Some(n) = parse_u64(&buf[1..cr]) else {
            return Resume::default();
        };
        if n == 0 || n > limits.max_multibulk_len as u64 {
            return Resume::default();
        }
        let mut r = Resume {
            active: true,
            args_left: n as usize,
            pos: cr + 2,
        };
        if r.advance(buf, limits) {
            // Disagrees with the parser's Incomplete: just parse next time.
            r = Resume::default();
        }
        r
    }

    /// Walks the arguments that arrived; true when the parser must run (the
    /// request may be complete, or may be malformed).
    fn advance(&mut self, buf: &[u8], limits: &Limits) -> bool {
        if buf.len() > limits.max_query_buffer {
            return true;
        }
        while self.args_left > 0 {
            let Some(rest) = buf.get(self.pos..) else {
                return true;
            };
            let Some(cr) = rest.iter().position(|&b| b == b'\r') else {
                return rest.len() > limits.max_inline_len;
            };
            if cr + 2 > rest.len() {
                return false;
            }
            if rest[0] != b'$' {
                return true;
            }
            let Some(len) = parse_u64(&rest[1..cr]) else {
                return true;
            };
            if len > limits.max_bulk_len as u64 {
                return true;
            }
            let need = (cr + 2) as u64 + len + 2;
            if (rest.len() as u64) < need {
                return false;
            }
            self.pos += need as usize;
            self.args_left -= 1;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_request, parse_request, Parsed};

    fn enc(args: &[&[u8]]) -> Vec<u8> {
        let mut o = Vec::new();
        encode_request(args, &mut o);
        o
    }

    /// Whenever `Resume` says "still incomplete", the parser says so too;
    /// and fed a request piece by piece it finds the end.
    #[test]
    fn resume_never_hides_a_parse_result() {
        let limits = Limits {
            max_bulk_len: 1 << 20,
            max_query_buffer: 1 << 22,
            ..Limits::default()
        };
        let unauth = Limits {
            max_multibulk_len: 10,
            max_bulk_len: 16384,
            ..limits
        };
        let big = vec![b'v'; 70_000];
        let mut reqs: Vec<Vec<u8>> = vec![
            enc(&[b"SET".as_slice(), b"k", b"value"]),
            enc(&[b"SET".as_slice(), b"k", &big]),
            enc(&[b"MSET".as_slice(), b"a", b"1", b"b", b"\r\n\r\n", b"", b"x"]),
            b"*2\r\n$3\r\nGET\r\n$-1\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\n$+1\r\nk\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\n$01\r\nk\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\nx1\r\nk\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\n$2000000\r\nk\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\n$20000\r\nk\r\n".to_vec(),
            b"*12\r\n$3\r\nGET\r\n".to_vec(),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nvXY*1\r\n$4\r\nPING\r\n".to_vec(),
            b"*1\r$4\r\nPING\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\n$18446744073709551615\r\nk\r\n".to_vec(),
            b"*18446744073709551616\r\n$3\r\nGET\r\n".to_vec(),
        ];
        let mut header_run = b"*2\r\n$3\r\nGET\r\n$".to_vec();
        header_run.extend_from_slice(&[b'1'; 70_000]);
        reqs.push(header_run);
        let mut skipped = 0;
        for lim in [&limits, &unauth] {
            for req in &reqs {
                let mut r = Resume::default();
                let step = if req.len() > 1000 { 997 } else { 1 };
                let mut n = 1;
                while n <= req.len() {
                    let buf = &req[..n];
                    if r.active {
                        if !r.advance(buf, lim) {
                            assert_eq!(
                                parse_request(buf, lim),
                                Parsed::Incomplete,
                                "Resume hid a result at {n} of {:?}",
                                String::from_utf8_lossy(&req[..req.len().min(80)])
                            );
                            skipped += 1;
                            n += step;
                            continue;
                        }
                        r = Resume::default();
                    }
                    if parse_request(buf, lim) == Parsed::Incomplete {
                        r = Resume::start(buf, lim);
                    }
                    n += step;
                }
                // The whole request: whatever the parser says, Resume lets it.
                let whole = parse_request(req, lim);
                if whole != Parsed::Incomplete {
                    let mut r = Resume::start(&req[..req.len() - 1], lim);
                    if r.active {
                        assert!(r.advance(req, lim));
                    }
                }
            }
        }
        assert!(skipped > 100, "Resume never engaged ({skipped})");
        // A pipeline: the first request's end is found incrementally.
        let mut p = enc(&[b"SET".as_slice(), b"k", &big]);
        let one = p.len();
        p.extend_from_slice(&enc(&[b"GET".as_slice(), b"k"]));
        let mut r = Resume::start(&p[..100], &limits);
        assert!(r.active);
        assert!(!r.advance(&p[..one - 1], &limits));
        assert!(r.advance(&p[..one], &limits));
        assert!(
            matches!(parse_request(&p, &limits), Parsed::Complete { consumed, .. } if consumed == one)
        );
    }

    /// The codec gives the same requests as the parser, whatever the reads'
    /// sizes, and an incomplete request costs a walk of what arrived.
    #[test]
    fn codec_decodes_a_pipeline_read_by_read() {
        let limits = Limits::default();
        let big = vec![b'v'; 100_000];
        let mut input = Vec::new();
        let reqs: Vec<Vec<Vec<u8>>> = vec![
            vec![b"SET".to_vec(), b"k".to_vec(), big.clone()],
            vec![b"GET".to_vec(), b"k".to_vec()],
            vec![b"PING".to_vec()],
        ];
        for r in &reqs {
            encode_request(r, &mut input);
        }
        input.extend_from_slice(b"ECHO hi\r\n");
        for chunk in [1usize, 7, 4096, input.len()] {
            let mut codec = RespCodec::default();
            let mut args = Args::default();
            let mut got: Vec<Vec<Vec<u8>>> = Vec::new();
            let mut buf: Vec<u8> = Vec::new();
            let mut fed = 0;
            while fed < input.len() {
                let end = (fed + chunk).min(input.len());
                buf.extend_from_slice(&input[fed..end]);
                fed = end;
                while let Some(n) = codec.decode(&buf, &limits, &mut args).unwrap() {
                    got.push(args.as_slice().to_vec());
                    buf.drain(..n);
                }
            }
            assert!(buf.is_empty());
            assert_eq!(got.len(), 4, "chunk {chunk}");
            assert_eq!(&got[..3], &reqs[..]);
            assert_eq!(got[3], vec![b"ECHO".to_vec(), b"hi".to_vec()]);
        }
    }
}
