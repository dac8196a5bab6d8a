//! A minimal RESP2 client for the server scenarios: PING, INFO, DBSIZE,
//! SHUTDOWN and pipelined SETs over a blocking [`Conn`] whose reads and writes
//! have a timeout, and the incremental parser ([`token`], [`parse_reply`])
//! that it and the RESP load generator ([`super::respload`]) share.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// One element of a reply as it lies in the buffer: a whole simple string,
/// error, integer or bulk string, or only the header of an array (its
/// elements follow as tokens of their own).
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Token<'a> {
    Simple(&'a [u8]),
    Error(&'a [u8]),
    Int(i64),
    Bulk(Option<&'a [u8]>),
    /// An array of this many elements (None: the null array).
    Array(Option<usize>),
}

/// The longest line before a reply's data that this parser accepts: RESP
/// header lines are short; more bytes without a line end is not a server
/// speaking RESP.
const MAX_LINE: usize = 64 * 1024;
/// The largest bulk string or array this parser accepts (the scenarios ask
/// for nothing near it; a bigger length is a broken stream).
const MAX_LEN: i64 = 512 << 20;

/// The first line of `buf` without its `\r\n`, and the bytes it takes with it.
fn line(buf: &[u8]) -> Result<Option<(&[u8], usize)>, String> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(i) => Ok(Some((&buf[..i], i + 2))),
        None if buf.len() > MAX_LINE => Err(format!("no line end in {} bytes", buf.len())),
        None => Ok(None),
    }
}

fn int(l: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(l)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad integer {:?}", String::from_utf8_lossy(l)))
}

/// A length of a bulk string or array header: -1 (null) or 0..=[`MAX_LEN`].
fn length(l: &[u8]) -> Result<Option<usize>, String> {
    match int(l)? {
        -1 => Ok(None),
        n if (0..=MAX_LEN).contains(&n) => Ok(Some(n as usize)),
        n => Err(format!("bad length {n}")),
    }
}

/// The token at the start of `buf` and the bytes it takes; None while it is
/// incomplete; an error for bytes that are not RESP2.
pub fn token(buf: &[u8]) -> Result<Option<(Token<'_>, usize)>, String> {
    let Some((l, n)) = line(buf)? else {
        return Ok(None);
    };
    let Some((&kind, rest)) = l.split_first() else {
        return Err("an empty line where a reply was expected".into());
    };
    let t = match kind {
        b'+' => Token::Simple(rest),
        b'-' => Token::Error(rest),
        b':' => Token::Int(int(rest)?),
        b'*' => Token::Array(length(rest)?),
        b'$' => match length(rest)? {
            None => Token::Bulk(None),
            Some(len) => {
                let end = n + len;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                if &buf[end..end + 2] != b"\r\n" {
                    return Err(format!("a bulk string of {len} bytes without its \\r\\n"));
                }
                return Ok(Some((Token::Bulk(Some(&buf[n..end])), end + 2)));
            }
        },
        _ => {
            return Err(format!(
                "unexpected reply line {:?}",
                String::from_utf8_lossy(&l[..l.len().min(80)])
            ))
        }
    };
    Ok(Some((t, n)))
}

/// The whole reply at the start of `buf` and the bytes it takes; None while
/// it is incomplete.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    let Some((t, mut n)) = token(buf)? else {
        return Ok(None);
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let r = match t {
        Token::Simple(s) => Reply::Simple(text(s)),
        Token::Error(s) => Reply::Error(text(s)),
        Token::Int(i) => Reply::Int(i),
        Token::Bulk(b) => Reply::Bulk(b.map(<[u8]>::to_vec)),
        Token::Array(None) => Reply::Array(None),
        Token::Array(Some(len)) => {
            let mut v = Vec::with_capacity(len.min(1024));
            for _ in 0..len {
                let Some((r, m)) = parse_reply(&buf[n..])? else {
                    return Ok(None);
                };
                v.push(r);
                n += m;
            }
            Reply::Array(Some(v))
        }
    };
    Ok(Some((r, n)))
}

/// Appends the multibulk encoding of `args` to `buf`.
pub fn encode(buf: &mut Vec<u8>, args: &[&[u8]]) {
    buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// A blocking connection and its read buffer.
pub struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
    /// Start of the unparsed bytes in `buf`.
    at: usize,
}

impl Conn {
    /// Connects to 127.0.0.1:`port`; reads and writes time out after `io_timeout`.
    pub fn connect(port: u16, io_timeout: Duration) -> io::Result<Conn> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(io_timeout))?;
        s.set_write_timeout(Some(io_timeout))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            s,
            buf: Vec::with_capacity(16 * 1024),
            at: 0,
        })
    }

    pub fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.s.write_all(bytes)
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        let mut buf = Vec::new();
        encode(&mut buf, args);
        self.write_raw(&buf)?;
        self.read_reply()
    }

    /// Reads the next reply (blocking until it is complete).
    pub fn read_reply(&mut self) -> io::Result<Reply> {
        loop {
            if let Some((r, n)) = parse_reply(&self.buf[self.at..]).map_err(bad)? {
                self.at += n;
                return Ok(r);
            }
            if self.at > 0 {
                self.buf.drain(..self.at);
                self.at = 0;
            }
            let old = self.buf.len();
            self.buf.resize(old + 16 * 1024, 0);
            let r = self.s.read(&mut self.buf[old..]);
            self.buf.truncate(old + *r.as_ref().unwrap_or(&0));
            match r {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed",
                    ))
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The connection's socket, for a caller that drives it itself (the
    /// load generator); an error if a reply was read and not consumed.
    pub fn into_stream(self) -> io::Result<TcpStream> {
        if self.at < self.buf.len() {
            return Err(bad(format!(
                "{} bytes of a reply not consumed",
                self.buf.len() - self.at
            )));
        }
        Ok(self.s)
    }

    /// DBSIZE.
    pub fn dbsize(&mut self) -> io::Result<i64> {
        match self.call(&[b"DBSIZE"])? {
            Reply::Int(n) => Ok(n),
            r => Err(bad(format!("DBSIZE answered {r:?}"))),
        }
    }

    /// `INFO section` as text.
    pub fn info(&mut self, section: &str) -> io::Result<String> {
        match self.call(&[b"INFO", section.as_bytes()])? {
            Reply::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
            r => Err(bad(format!("INFO answered {r:?}"))),
        }
    }

    /// Puts keys `key:{i:012}` for `i` in `0..keys`, each with a `value_size`-byte
    /// value, pipelined `batch` at a time; every reply must be +OK.
    pub fn load(&mut self, keys: u64, value_size: usize, batch: u64) -> io::Result<()> {
        let value = vec![b'x'; value_size];
        let mut buf = Vec::new();
        let mut i = 0u64;
        while i < keys {
            let n = batch.min(keys - i);
            buf.clear();
            for k in i..i + n {
                let key = format!("key:{k:012}");
                encode(&mut buf, &[b"SET", key.as_bytes(), &value]);
            }
            self.write_raw(&buf)?;
            for _ in 0..n {
                match self.read_reply()? {
                    Reply::Simple(s) if s == "OK" => {}
                    r => return Err(bad(format!("SET answered {r:?}"))),
                }
            }
            i += n;
        }
        Ok(())
    }
}

/// The value of `field:` in an INFO text.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_multibulk() {
        let mut b = Vec::new();
        encode(&mut b, &[b"SET", b"k", b""]);
        assert_eq!(b, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
    }

    #[test]
    fn parses_replies_in_pieces() {
        let all: &[u8] = b"*3\r\n$7\r\nmessage\r\n$-1\r\n*2\r\n+OK\r\n:-42\r\n-ERR x\r\n";
        let want = Reply::Array(Some(vec![
            Reply::Bulk(Some(b"message".to_vec())),
            Reply::Bulk(None),
            Reply::Array(Some(vec![Reply::Simple("OK".into()), Reply::Int(-42)])),
        ]));
        let first = all.len() - b"-ERR x\r\n".len();
        // Every strict prefix of the first reply is incomplete.
        for i in 0..first {
            assert_eq!(parse_reply(&all[..i]).unwrap(), None, "prefix {i}");
        }
        assert_eq!(parse_reply(all).unwrap(), Some((want, first)));
        assert_eq!(
            parse_reply(&all[first..]).unwrap(),
            Some((Reply::Error("ERR x".into()), all.len() - first))
        );
        assert_eq!(
            token(b"$3\r\nabc\r\n").unwrap(),
            Some((Token::Bulk(Some(&b"abc"[..])), 9))
        );
        assert_eq!(token(b"*-1\r\n").unwrap(), Some((Token::Array(None), 5)));
    }

    #[test]
    fn refuses_what_is_not_resp() {
        for bad in [
            &b"?x\r\n"[..],
            b"\r\n",
            b":12a\r\n",
            b"$3\r\nabcd\r\n",
            b"$-2\r\n",
            b"*99999999999\r\n",
        ] {
            assert!(parse_reply(bad).is_err(), "{bad:?}");
        }
        assert!(token(&vec![b'+'; MAX_LINE + 1]).is_err());
    }

    #[test]
    fn finds_info_fields() {
        let info =
            "# Ember\r\nengine:bullet-full\r\npersistence_strategy:clwb: survives SIGKILL\r\n";
        assert_eq!(info_field(info, "engine"), Some("bullet-full"));
        assert_eq!(
            info_field(info, "persistence_strategy"),
            Some("clwb: survives SIGKILL")
        );
        assert_eq!(info_field(info, "nope"), None);
    }
}
