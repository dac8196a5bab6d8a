//! Redis RDB files (version 10, Redis 7.0, and older versions back to 1),
//! read and written as streams for `ember import` and `ember export`.
//!
//! A file is the magic `REDIS` and a 4-digit version, then records each
//! introduced by an opcode: AUX fields (name, value), module aux data
//! (refused: modules are not supported), function libraries (7.0 GA, and
//! the release candidates' form), SELECTDB, RESIZEDB (a size hint), and per
//! key an optional expiry (ms, or s in old files), LRU idle time or LFU
//! frequency, then the value's type byte, the key and the value in the
//! encodings of [`crate::rdb`]. EOF ends it, followed (version 5 on) by
//! the CRC-64 of everything before it, 0 when the writer had checksums off.
//! Facts from Redis's rdb.h and rdb.c; the code is ours.
//!
//! [`FileReader`] reads one record at a time (one value in memory, never
//! the file); [`FileWriter`] writes one key at a time through a buffer.

use crate::rdb::{self, Input, RdbError, Value};
use crc::{Crc, Digest, CRC_64_REDIS};
use std::fmt;
use std::io::{BufWriter, Read, Write};

static CRC64: Crc<u64> = Crc::<u64>::new(&CRC_64_REDIS);

const OPCODE_MODULE_AUX: u8 = 247;
const OPCODE_IDLE: u8 = 248;
const OPCODE_FREQ: u8 = 249;
const OPCODE_AUX: u8 = 250;
const OPCODE_RESIZEDB: u8 = 251;
const OPCODE_EXPIRETIME_MS: u8 = 252;
const OPCODE_EXPIRETIME: u8 = 253;
const OPCODE_SELECTDB: u8 = 254;
const OPCODE_EOF: u8 = 255;
const TYPE_MODULE: u8 = 6;
const TYPE_MODULE_2: u8 = 7;
const TYPE_HASH_ZIPMAP: u8 = 9;

/// Why a file was refused: what, and the byte offset where the record (or
/// the field) that failed begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    pub offset: u64,
    pub what: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte offset {}: {}", self.offset, self.what)
    }
}

impl std::error::Error for FileError {}

/// One record of an RDB file, as [`FileReader::read_record`] returns it.
#[derive(Debug, PartialEq)]
pub enum Record {
    /// An AUX field (`redis-ver`, `ctime`...).
    Aux(Vec<u8>, Vec<u8>),
    /// A function library's code.
    Function(Vec<u8>),
    /// The keys that follow belong to this database.
    SelectDb(u64),
    /// A key of the current database, its value and its expiry time (ms
    /// since the epoch).
    Key {
        db: u64,
        key: Vec<u8>,
        value: Value,
        expire_ms: Option<i64>,
        /// Where its record begins.
        offset: u64,
    },
    /// The end, its checksum verified (or absent, or 0: not written).
    Eof,
}

/// Reads an RDB file record by record.
pub struct FileReader<R: Read> {
    inner: R,
    /// Read ahead: `buf[pos..end]` is not consumed yet; `buf[sum..pos]` is
    /// consumed and not yet in the CRC (which is updated a buffer at a time).
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    sum: usize,
    /// Bytes consumed so far.
    at: u64,
    /// The file's size (an upper bound on what a length can claim).
    size: u64,
    crc: Digest<'static, u64>,
    version: u16,
    db: u64,
    /// A read ran past the end.
    short: bool,
    done: bool,
}

impl<R: Read> Input for FileReader<R> {
    fn bytes(&mut self, n: usize) -> Result<Vec<u8>, RdbError> {
        if n as u64 > self.left() {
            self.short = true;
            return Err(RdbError::BadFormat);
        }
        let mut v = vec![0u8; n];
        self.fill(&mut v)?;
        Ok(v)
    }

    fn fill(&mut self, out: &mut [u8]) -> Result<(), RdbError> {
        let mut done = 0;
        while done < out.len() {
            if self.pos == self.end && !self.refill() {
                self.short = true;
                return Err(RdbError::BadFormat);
            }
            let n = (out.len() - done).min(self.end - self.pos);
            out[done..done + n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
            self.pos += n;
            done += n;
        }
        self.at += out.len() as u64;
        Ok(())
    }

    fn left(&self) -> u64 {
        self.size.saturating_sub(self.at)
    }
}

impl<R: Read> FileReader<R> {
    /// Brings the CRC up to what was consumed, then reads more; false at
    /// the end of the file (or on a read error, reported as the end).
    fn refill(&mut self) -> bool {
        self.crc.update(&self.buf[self.sum..self.pos]);
        loop {
            match self.inner.read(&mut self.buf) {
                Ok(n) => {
                    (self.pos, self.end, self.sum) = (0, n, 0);
                    return n > 0;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    (self.pos, self.end, self.sum) = (0, 0, 0);
                    return false;
                }
            }
        }
    }

    /// Starts reading `r`, `size` bytes long: checks the magic and version.
    pub fn new(r: R, size: u64) -> Result<FileReader<R>, FileError> {
        let mut f = FileReader {
            inner: r,
            buf: vec![0; 1 << 20],
            pos: 0,
            end: 0,
            sum: 0,
            at: 0,
            size,
            crc: CRC64.digest(),
            version: 0,
            db: 0,
            short: false,
            done: false,
        };
        let head = f
            .bytes(9)
            .map_err(|_| f.err(0, "too short for an RDB file".into()))?;
        if &head[..5] != b"REDIS" {
            return Err(f.err(0, "not an RDB file (no REDIS magic)".into()));
        }
        let ver = std::str::from_utf8(&head[5..])
            .ok()
            .and_then(|v| v.parse::<u16>().ok())
            .filter(|v| (1..=rdb::RDB_VERSION).contains(v))
            .ok_or_else(|| {
                f.err(
                    5,
                    format!(
                        "RDB version '{}' is not one this version reads (1 to {})",
                        String::from_utf8_lossy(&head[5..]),
                        rdb::RDB_VERSION
                    ),
                )
            })?;
        f.version = ver;
        Ok(f)
    }

    /// The file's RDB version.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Bytes read so far.
    pub fn offset(&self) -> u64 {
        self.at
    }

    fn err(&self, offset: u64, what: String) -> FileError {
        let what = if self.short {
            format!(
                "{what}: the file ends early (truncated at {} bytes)",
                self.size
            )
        } else {
            what
        };
        FileError { offset, what }
    }

    /// The next record (after [`Record::Eof`], Eof again).
    pub fn read_record(&mut self) -> Result<Record, FileError> {
        if self.done {
            return Ok(Record::Eof);
        }
        let start = self.at;
        let mut expire_ms = None;
        loop {
            let op_at = self.at;
            let op = self
                .u8()
                .map_err(|_| self.err(op_at, "reading the next record".into()))?;
            let bad = |s: &Self, what: &str| s.err(op_at, what.to_string());
            match op {
                OPCODE_EOF => {
                    self.done = true;
                    self.check_sum(op_at)?;
                    return Ok(Record::Eof);
                }
                OPCODE_AUX => {
                    let k = self.string().map_err(|_| bad(self, "bad AUX field"))?;
                    let v = self.string().map_err(|_| bad(self, "bad AUX field"))?;
                    return Ok(Record::Aux(k, v));
                }
                OPCODE_SELECTDB => {
                    let db = self.length().map_err(|_| bad(self, "bad SELECTDB"))?;
                    self.db = db;
                    return Ok(Record::SelectDb(db));
                }
                OPCODE_RESIZEDB => {
                    self.length().map_err(|_| bad(self, "bad RESIZEDB"))?;
                    self.length().map_err(|_| bad(self, "bad RESIZEDB"))?;
                }
                OPCODE_EXPIRETIME_MS => {
                    let b: [u8; 8] = self.array().map_err(|_| bad(self, "bad EXPIRETIME_MS"))?;
                    // Big-endian hosts wrote it in their order before RDB 9;
                    // every file read here comes from a little-endian one.
                    expire_ms = Some(i64::from_le_bytes(b));
                }
                OPCODE_EXPIRETIME => {
                    let b: [u8; 4] = self.array().map_err(|_| bad(self, "bad EXPIRETIME"))?;
                    expire_ms = Some(i64::from(i32::from_le_bytes(b)) * 1000);
                }
                OPCODE_IDLE => {
                    // Ember keeps no access times: read and dropped.
                    self.length().map_err(|_| bad(self, "bad IDLE"))?;
                }
                OPCODE_FREQ => {
                    self.u8().map_err(|_| bad(self, "bad FREQ"))?;
                }
                OPCODE_MODULE_AUX => {
                    return Err(bad(
                        self,
                        "module auxiliary data: modules are not supported by Ember",
                    ))
                }
                rdb::OPCODE_FUNCTION2 | rdb::OPCODE_FUNCTION_PRE_GA => {
                    return self.function(op, op_at);
                }
                TYPE_MODULE | TYPE_MODULE_2 => {
                    return Err(bad(
                        self,
                        "a module value: modules are not supported by Ember",
                    ))
                }
                TYPE_HASH_ZIPMAP => {
                    return Err(bad(
                        self,
                        "a zipmap hash (Redis before 2.6): not read by this version",
                    ))
                }
                t if rdb::is_value_type(t) => {
                    let key = self.string().map_err(|_| bad(self, "bad key"))?;
                    let value = rdb::read_value(self, t).map_err(|_| {
                        self.err(
                            start,
                            format!(
                                "key '{}' (RDB type {t}): bad data format",
                                String::from_utf8_lossy(&key)
                            ),
                        )
                    })?;
                    return Ok(Record::Key {
                        db: self.db,
                        key,
                        value,
                        expire_ms,
                        offset: start,
                    });
                }
                t => return Err(bad(self, &format!("unknown RDB type or opcode {t}"))),
            }
        }
    }

    /// A function record (the opcode read).
    fn function(&mut self, op: u8, at: u64) -> Result<Record, FileError> {
        let mut rec = vec![op];
        let fail = |s: &Self| s.err(at, "bad function library record".into());
        if op == rdb::OPCODE_FUNCTION2 {
            let code = self.string().map_err(|_| fail(self))?;
            rdb::put_str(&mut rec, &code);
        } else {
            let name = self.string().map_err(|_| fail(self))?;
            let engine = self.string().map_err(|_| fail(self))?;
            rdb::put_str(&mut rec, &name);
            rdb::put_str(&mut rec, &engine);
            let has_desc = self.length().map_err(|_| fail(self))?;
            rdb::put_len(&mut rec, has_desc);
            if has_desc != 0 {
                let d = self.string().map_err(|_| fail(self))?;
                rdb::put_str(&mut rec, &d);
            }
            let blob = self.string().map_err(|_| fail(self))?;
            rdb::put_str(&mut rec, &blob);
        }
        // The one parser of function records (FUNCTION RESTORE's), with a
        // footer for its length arithmetic.
        rec.extend_from_slice(&[0; 10]);
        let mut codes = rdb::restore_functions(&rec).map_err(|e| self.err(at, e.to_string()))?;
        match codes.pop() {
            Some(code) if codes.is_empty() => Ok(Record::Function(code)),
            _ => Err(fail(self)),
        }
    }

    /// After EOF: the checksum, when the version has one.
    fn check_sum(&mut self, at: u64) -> Result<(), FileError> {
        if self.version < 5 {
            return Ok(());
        }
        self.crc.update(&self.buf[self.sum..self.pos]);
        self.sum = self.pos;
        let computed = self.crc.clone().finalize();
        let mut b = [0u8; 8];
        if self.fill(&mut b).is_err() {
            return Err(self.err(at + 1, "the checksum after EOF is missing".into()));
        }
        let stored = u64::from_le_bytes(b);
        if stored != 0 && stored != computed {
            return Err(self.err(
                at + 1,
                format!(
                    "wrong CRC-64: the file says {stored:#018x}, its bytes give {computed:#018x}"
                ),
            ));
        }
        if self.pos < self.end || self.refill() {
            return Err(self.err(at + 9, "bytes after the end of the RDB file".into()));
        }
        Ok(())
    }
}

/// Writes an RDB file (version 10) key by key.
pub struct FileWriter<W: Write> {
    out: BufWriter<W>,
    crc: Digest<'static, u64>,
    buf: Vec<u8>,
    written: u64,
}

impl<W: Write> FileWriter<W> {
    /// Starts the file: magic, version and `aux` fields.
    pub fn new(w: W, aux: &[(&str, &str)]) -> std::io::Result<FileWriter<W>> {
        let mut f = FileWriter {
            out: BufWriter::with_capacity(1 << 20, w),
            crc: CRC64.digest(),
            buf: Vec::new(),
            written: 0,
        };
        f.buf
            .extend_from_slice(format!("REDIS{:04}", rdb::RDB_VERSION).as_bytes());
        for (k, v) in aux {
            f.buf.push(OPCODE_AUX);
            rdb::put_str(&mut f.buf, k.as_bytes());
            rdb::put_str(&mut f.buf, v.as_bytes());
        }
        f.flush_buf()?;
        Ok(f)
    }

    fn flush_buf(&mut self) -> std::io::Result<()> {
        self.crc.update(&self.buf);
        self.out.write_all(&self.buf)?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written + self.buf.len() as u64
    }

    /// A function library.
    pub fn function(&mut self, code: &[u8]) -> std::io::Result<()> {
        self.buf.push(rdb::OPCODE_FUNCTION2);
        rdb::put_str(&mut self.buf, code);
        self.flush_buf()
    }

    /// The keys that follow are database `db`'s; `keys` and `expires` are
    /// the loader's size hints.
    pub fn select_db(&mut self, db: u64, keys: u64, expires: u64) -> std::io::Result<()> {
        self.buf.push(OPCODE_SELECTDB);
        rdb::put_len(&mut self.buf, db);
        self.buf.push(OPCODE_RESIZEDB);
        rdb::put_len(&mut self.buf, keys);
        rdb::put_len(&mut self.buf, expires);
        self.flush_buf()
    }

    /// A key, its value and its expiry time (ms since the epoch).
    pub fn key(&mut self, key: &[u8], v: &Value, expire_ms: Option<i64>) -> std::io::Result<()> {
        if let Some(t) = expire_ms {
            self.buf.push(OPCODE_EXPIRETIME_MS);
            self.buf.extend_from_slice(&t.to_le_bytes());
        }
        rdb::encode_keyed(&mut self.buf, Some(key), v);
        self.flush_buf()
    }

    /// EOF and the checksum; returns the writer, flushed.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.buf.push(OPCODE_EOF);
        self.flush_buf()?;
        let sum = self.crc.finalize();
        self.out.write_all(&sum.to_le_bytes())?;
        self.out.into_inner().map_err(|e| e.into_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut w = FileWriter::new(Vec::new(), &[("redis-bits", "64")]).unwrap();
        w.function(b"#!lua name=lib\nredis.register_function('f', function() return 1 end)")
            .unwrap();
        w.select_db(0, 2, 1).unwrap();
        w.key(b"s", &Value::String(b"v".to_vec()), None).unwrap();
        w.key(
            b"l",
            &Value::List(vec![b"a".to_vec(), b"1".to_vec()]),
            Some(4_000_000_000_000),
        )
        .unwrap();
        w.select_db(3, 1, 0).unwrap();
        w.key(b"z", &Value::Zset(vec![(b"m".to_vec(), 1.5)]), None)
            .unwrap();
        w.finish().unwrap()
    }

    fn read_all(b: &[u8]) -> Result<Vec<Record>, FileError> {
        let mut r = FileReader::new(b, b.len() as u64)?;
        let mut out = Vec::new();
        loop {
            let rec = r.read_record()?;
            if rec == Record::Eof {
                return Ok(out);
            }
            out.push(rec);
        }
    }

    #[test]
    fn a_written_file_reads_back() {
        let recs = read_all(&sample()).unwrap();
        let keys: Vec<_> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Key {
                    db, key, expire_ms, ..
                } => Some((*db, key.clone(), *expire_ms)),
                _ => None,
            })
            .collect();
        assert_eq!(
            keys,
            vec![
                (0, b"s".to_vec(), None),
                (0, b"l".to_vec(), Some(4_000_000_000_000)),
                (3, b"z".to_vec(), None)
            ]
        );
        assert!(recs
            .iter()
            .any(|r| matches!(r, Record::Function(c) if c.starts_with(b"#!lua"))));
    }

    #[test]
    fn damage_is_an_error_never_a_panic() {
        let f = sample();
        for cut in 0..f.len() {
            assert!(read_all(&f[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..f.len() {
            for bit in [0x01, 0x80] {
                let mut g = f.clone();
                g[i] ^= bit;
                // Every flip is caught: by the parser or by the checksum.
                assert!(read_all(&g).is_err(), "flip at {i}");
            }
        }
        let mut g = f.clone();
        g.push(0);
        assert!(read_all(&g).unwrap_err().what.contains("after the end"));
        // A zero checksum means none was written.
        let mut g = f.clone();
        let n = g.len();
        g[n - 8..].fill(0);
        assert!(read_all(&g).is_ok());
    }
}
