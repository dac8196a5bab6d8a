//! A minimal blocking RESP2 client for the server scenarios: PING, INFO, DBSIZE,
//! SHUTDOWN and pipelined SETs. Every read and write has a timeout.

use std::io::{self, BufRead, BufReader, Read, Write};
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

pub struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
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

impl Conn {
    /// Connects to 127.0.0.1:`port`; reads and writes time out after `io_timeout`.
    pub fn connect(port: u16, io_timeout: Duration) -> io::Result<Conn> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(io_timeout))?;
        s.set_write_timeout(Some(io_timeout))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    pub fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.w.write_all(bytes)
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        let mut buf = Vec::new();
        encode(&mut buf, args);
        self.write_raw(&buf)?;
        self.read_reply()
    }

    fn line(&mut self) -> io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        Ok(l.trim_end_matches(['\r', '\n']).to_string())
    }

    pub fn read_reply(&mut self) -> io::Result<Reply> {
        let l = self.line()?;
        let (kind, rest) = l.split_at(l.len().min(1));
        let int = |s: &str| {
            s.parse::<i64>()
                .map_err(|_| bad(format!("bad integer in reply {l:?}")))
        };
        Ok(match kind {
            "+" => Reply::Simple(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(int(rest)?),
            "$" => {
                let n = int(rest)?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut b = vec![0u8; n as usize + 2];
                    self.r.read_exact(&mut b)?;
                    b.truncate(n as usize);
                    Reply::Bulk(Some(b))
                }
            }
            "*" => {
                let n = int(rest)?;
                if n < 0 {
                    Reply::Array(None)
                } else {
                    let mut v = Vec::with_capacity(n.min(1024) as usize);
                    for _ in 0..n {
                        v.push(self.read_reply()?);
                    }
                    Reply::Array(Some(v))
                }
            }
            _ => return Err(bad(format!("unexpected reply line {l:?}"))),
        })
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
