//! [`Resume`]: how far a pending multibulk request has arrived, so that a
//! worker (`worker`) parses a request that comes in many reads once it may
//! be complete rather than on every read. Self-contained: it looks only at
//! the buffered bytes and the protocol limits.

use proto::Limits;

/// Where the scan of a pending (incomplete) multibulk request stands.
///
/// The request parser is stateless: given an incomplete request it starts
/// over from its first byte each time. A request of many arguments arriving
/// in many reads would be re-parsed once per read, quadratic in its size (a
/// 4 MB MSET took 0.7 s of a worker). `Resume` walks the frame structure
/// incrementally, as far as the bytes go, and says when the parser might have
/// something other than `Incomplete` to say: the request looks complete, or
/// something in it is not plainly well-formed (the parser then reports the
/// error with its exact text). It only decides when to parse, never what a
/// request means, and it errs towards parsing: whenever it reports "still
/// incomplete", [`proto::parse_request`] would too (a unit test checks this
/// on every prefix of a set of requests).
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resume {
    pub(crate) active: bool,
    /// Arguments not yet complete.
    args_left: usize,
    /// Offset (from the request's start) of the first incomplete argument.
    pos: usize,
}

impl Resume {
    /// Starts tracking the request at the front of `buf`, which the parser
    /// found incomplete. Inactive unless it is a multibulk request whose
    /// count line is complete and positive.
    pub(crate) fn start(buf: &[u8], limits: &Limits) -> Resume {
        if buf.first() != Some(&b'*') {
            return Resume::default();
        }
        let Some(cr) = buf.iter().position(|&b| b == b'\r') else {
            return Resume::default();
        };
        if cr + 2 > buf.len() {
            return Resume::default();
        }
        let Some(n) = digits(&buf[1..cr]) else {
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
    pub(crate) fn advance(&mut self, buf: &[u8], limits: &Limits) -> bool {
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
            let Some(len) = digits(&rest[1..cr]) else {
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

/// A non-negative integer as Redis's `string2ll` accepts it: digits only, no
/// sign, no leading zero, no overflow.
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || (s[0] == b'0' && s.len() > 1) {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::Parsed;

    fn enc(args: &[&[u8]]) -> Vec<u8> {
        let mut o = Vec::new();
        proto::encode_request(args, &mut o);
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
                                proto::parse_request(buf, lim),
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
                    if proto::parse_request(buf, lim) == Parsed::Incomplete {
                        r = Resume::start(buf, lim);
                    }
                    n += step;
                }
                // The whole request: whatever the parser says, Resume lets it.
                let whole = proto::parse_request(req, lim);
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
            matches!(proto::parse_request(&p, &limits), Parsed::Complete { consumed, .. } if consumed == one)
        );
    }

    #[test]
    fn digits_like_string2ll() {
        assert_eq!(digits(b"0"), Some(0));
        assert_eq!(digits(b"123"), Some(123));
        for bad in [
            &b""[..],
            b"01",
            b"+1",
            b"-1",
            b" 1",
            b"1 ",
            b"99999999999999999999",
            b"1a",
        ] {
            assert_eq!(digits(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
