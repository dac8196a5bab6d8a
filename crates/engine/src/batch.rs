//! A command's writes as one value: a [`WriteBatch`] of [`Op`]s on keys.
//!
//! A command (later a transaction or a script) that writes does not change the
//! store while it decides what to write: it stages its operations in a batch,
//! reading its own staged writes through [`WriteBatch::newest`], and the
//! batch is applied as a unit ([`crate::Session::apply_batch`]) before the
//! command's locks are released. Everything non-deterministic (the clock for a
//! relative TTL, a random choice) is resolved before an operation is staged,
//! so a batch means the same wherever and whenever it is applied: it is what
//! a log record of the command holds, what replication ships, and what a
//! replica or a recovery replays.
//!
//! The batch is kept in its encoded form, so that logging or shipping it
//! costs no conversion: [`WriteBatch::as_bytes`] is the encoding and
//! [`WriteBatch::from_bytes`] reads it back. Per operation, little-endian:
//!
//! | field | bytes |
//! |---|---|
//! | key length `k` | 4 |
//! | key | `k` |
//! | opcode ([`crate::OPC_PUT`], [`crate::OPC_REMOVE`], [`crate::OPC_INCR`], [`crate::OPC_MERGE`]) | 1 |
//! | `Put`: value length `v`, value | 4 + `v` |
//! | `Merge`: payload length `v`, payload | 4 + `v` |
//! | `Incr`: the delta | 8 |
//! | `Remove`: nothing | 0 |

use crate::{Error, Op, Result, OPC_INCR, OPC_MERGE, OPC_PUT, OPC_REMOVE};
use std::collections::HashMap;

/// Where one staged operation lies in the encoding.
#[derive(Clone, Copy, Debug)]
struct Entry {
    key: usize,
    key_len: usize,
    code: u8,
    /// The value's (`Put`) or payload's (`Merge`) offset and length, or nothing.
    val: usize,
    val_len: usize,
    delta: i64,
}

/// Batches up to this many operations find a key's newest operation by a
/// backwards scan; larger ones keep an index.
const SCAN_LIMIT: usize = 16;

/// Operations on keys, in the order they are to be applied.
#[derive(Default, Debug)]
pub struct WriteBatch {
    buf: Vec<u8>,
    entries: Vec<Entry>,
    /// Key → index of its newest entry, once the batch outgrows a scan.
    index: HashMap<Vec<u8>, usize>,
}

impl WriteBatch {
    pub fn new() -> WriteBatch {
        WriteBatch::default()
    }

    /// Number of operations.
    #[inline]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Empties the batch, keeping its memory (up to a bound).
    #[inline]
    pub fn clear(&mut self) {
        const KEEP: usize = 1 << 20;
        if self.buf.capacity() > KEEP {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        self.entries.clear();
        self.index.clear();
    }

    #[inline]
    fn begin(&mut self, key: &[u8], code: u8) -> Entry {
        self.buf
            .extend_from_slice(&(key.len() as u32).to_le_bytes());
        let at = self.buf.len();
        self.buf.extend_from_slice(key);
        self.buf.push(code);
        Entry {
            key: at,
            key_len: key.len(),
            code,
            val: 0,
            val_len: 0,
            delta: 0,
        }
    }

    #[inline]
    fn finish(&mut self, e: Entry) {
        let i = self.entries.len();
        self.entries.push(e);
        if self.entries.len() > SCAN_LIMIT {
            if self.index.is_empty() {
                for (j, e) in self.entries.iter().enumerate() {
                    self.index
                        .insert(self.buf[e.key..e.key + e.key_len].to_vec(), j);
                }
            } else {
                self.index
                    .insert(self.buf[e.key..e.key + e.key_len].to_vec(), i);
            }
        }
    }

    /// Stages `Put(value)`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.put_with(key, value.len(), |out| out.extend_from_slice(value));
    }

    /// Stages a `Put` whose value `fill` appends to the buffer it is given
    /// (`len` is a capacity hint): the value is built in place, not copied.
    #[inline]
    pub fn put_with(&mut self, key: &[u8], len: usize, fill: impl FnOnce(&mut Vec<u8>)) {
        self.bytes_with(key, OPC_PUT, len, fill)
    }

    /// Stages `Merge(payload)`.
    pub fn merge(&mut self, key: &[u8], payload: &[u8]) {
        self.merge_with(key, payload.len(), |out| out.extend_from_slice(payload));
    }

    /// Stages a `Merge` whose payload `fill` appends to the buffer it is
    /// given (`len` is a capacity hint).
    #[inline]
    pub fn merge_with(&mut self, key: &[u8], len: usize, fill: impl FnOnce(&mut Vec<u8>)) {
        self.bytes_with(key, OPC_MERGE, len, fill)
    }

    /// Stages an operation whose payload is length-prefixed bytes.
    #[inline]
    fn bytes_with(&mut self, key: &[u8], code: u8, len: usize, fill: impl FnOnce(&mut Vec<u8>)) {
        let mut e = self.begin(key, code);
        let len_at = self.buf.len();
        self.buf.reserve(4 + len);
        self.buf.extend_from_slice(&[0; 4]);
        e.val = self.buf.len();
        fill(&mut self.buf);
        e.val_len = self.buf.len() - e.val;
        self.buf[len_at..len_at + 4].copy_from_slice(&(e.val_len as u32).to_le_bytes());
        self.finish(e);
    }

    /// Stages `Remove`.
    #[inline]
    pub fn remove(&mut self, key: &[u8]) {
        let e = self.begin(key, OPC_REMOVE);
        self.finish(e);
    }

    /// Stages `Incr(delta)`.
    pub fn incr(&mut self, key: &[u8], delta: i64) {
        let mut e = self.begin(key, OPC_INCR);
        self.buf.extend_from_slice(&delta.to_le_bytes());
        e.delta = delta;
        self.finish(e);
    }

    #[inline]
    fn entry(&self, e: &Entry) -> (&[u8], Op<'_>) {
        let key = &self.buf[e.key..e.key + e.key_len];
        let op = match e.code {
            OPC_PUT => Op::Put(&self.buf[e.val..e.val + e.val_len]),
            OPC_MERGE => Op::Merge(&self.buf[e.val..e.val + e.val_len]),
            OPC_REMOVE => Op::Remove,
            _ => Op::Incr(e.delta),
        };
        (key, op)
    }

    /// The operations, in order.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Op<'_>)> {
        self.entries.iter().map(|e| self.entry(e))
    }

    /// The newest staged operation on `key`: what a read of `key` inside the
    /// command must see (for a `Put` or `Remove`; an `Incr` or a `Merge`
    /// needs the value under it).
    #[inline]
    pub fn newest(&self, key: &[u8]) -> Option<Op<'_>> {
        let e = if self.index.is_empty() {
            self.entries
                .iter()
                .rev()
                .find(|e| &self.buf[e.key..e.key + e.key_len] == key)?
        } else {
            &self.entries[*self.index.get(key)?]
        };
        Some(self.entry(e).1)
    }

    /// The encoding (see the module documentation).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Reads an encoding back; a malformed one is an error, never a panic.
    pub fn from_bytes(bytes: &[u8]) -> Result<WriteBatch> {
        fn bad(what: &str) -> Error {
            Error::Corrupt(format!("write batch: {what}"))
        }
        fn take<'a>(b: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8]> {
            let s = b
                .get(*at..at.checked_add(n).ok_or_else(|| bad("length"))?)
                .ok_or_else(|| bad("truncated"))?;
            *at += n;
            Ok(s)
        }
        fn u32_at(b: &[u8], at: &mut usize) -> Result<usize> {
            let s = take(b, at, 4)?;
            Ok(u32::from_le_bytes(s.try_into().expect("4 bytes")) as usize)
        }
        let mut w = WriteBatch::new();
        let mut at = 0;
        while at < bytes.len() {
            let n = u32_at(bytes, &mut at)?;
            let key = take(bytes, &mut at, n)?;
            let code = take(bytes, &mut at, 1)?[0];
            match code {
                OPC_PUT => {
                    let n = u32_at(bytes, &mut at)?;
                    w.put(key, take(bytes, &mut at, n)?);
                }
                OPC_MERGE => {
                    let n = u32_at(bytes, &mut at)?;
                    w.merge(key, take(bytes, &mut at, n)?);
                }
                OPC_REMOVE => w.remove(key),
                OPC_INCR => {
                    let d = take(bytes, &mut at, 8)?;
                    w.incr(key, i64::from_le_bytes(d.try_into().expect("8 bytes")));
                }
                _ => return Err(bad("unknown opcode")),
            }
        }
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum M {
        Put(Vec<u8>, Vec<u8>),
        Remove(Vec<u8>),
        Incr(Vec<u8>, i64),
        Merge(Vec<u8>, Vec<u8>),
    }

    fn m() -> impl Strategy<Value = M> {
        let key = proptest::collection::vec(0u8..4, 0..3);
        prop_oneof![
            (key.clone(), proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(|(k, v)| M::Put(k, v)),
            key.clone().prop_map(M::Remove),
            (key.clone(), any::<i64>()).prop_map(|(k, d)| M::Incr(k, d)),
            (key, proptest::collection::vec(any::<u8>(), 0..20)).prop_map(|(k, p)| M::Merge(k, p)),
        ]
    }

    proptest! {
        /// The batch holds what was staged, in order; `newest` agrees with a
        /// scan of the model, below and above the index threshold; the
        /// encoding reads back to the same operations; a truncated encoding
        /// is refused.
        #[test]
        fn batch_matches_a_model(ms in proptest::collection::vec(m(), 0..60), cut in any::<usize>()) {
            let mut w = WriteBatch::new();
            for x in &ms {
                match x {
                    M::Put(k, v) => w.put(k, v),
                    M::Remove(k) => w.remove(k),
                    M::Incr(k, d) => w.incr(k, *d),
                    M::Merge(k, p) => w.merge(k, p),
                }
            }
            let got: Vec<(Vec<u8>, Op<'_>)> = w.iter().map(|(k, o)| (k.to_vec(), o)).collect();
            prop_assert_eq!(got.len(), ms.len());
            for ((k, o), x) in got.iter().zip(&ms) {
                match x {
                    M::Put(mk, v) => prop_assert_eq!((k, *o), (mk, Op::Put(v))),
                    M::Remove(mk) => prop_assert_eq!((k, *o), (mk, Op::Remove)),
                    M::Incr(mk, d) => prop_assert_eq!((k, *o), (mk, Op::Incr(*d))),
                    M::Merge(mk, p) => prop_assert_eq!((k, *o), (mk, Op::Merge(p))),
                }
            }
            for key in [vec![], vec![0], vec![1, 2], vec![3, 3]] {
                let want = got.iter().rev().find(|(k, _)| *k == key).map(|(_, o)| *o);
                prop_assert_eq!(w.newest(&key), want);
            }
            let back = WriteBatch::from_bytes(w.as_bytes()).unwrap();
            prop_assert!(back.iter().eq(w.iter()));
            if !w.is_empty() {
                let n = cut % w.as_bytes().len();
                let r = WriteBatch::from_bytes(&w.as_bytes()[..n]);
                // A cut at an operation boundary is a shorter valid batch.
                if let Ok(short) = r {
                    prop_assert!(short.len() < w.len());
                    prop_assert!(short.iter().zip(w.iter()).all(|(a, b)| a == b));
                }
            }
            w.clear();
            prop_assert!(w.is_empty() && w.newest(&[0]).is_none());
        }
    }

    #[test]
    fn garbage_is_refused() {
        assert!(WriteBatch::from_bytes(&[1, 0, 0, 0, b'k', 9]).is_err());
        assert!(WriteBatch::from_bytes(&[255, 255, 255, 255]).is_err());
        assert!(WriteBatch::from_bytes(&[0, 0, 0, 0, OPC_PUT, 5, 0, 0, 0, 1]).is_err());
        assert!(WriteBatch::from_bytes(&[]).unwrap().is_empty());
    }
}
