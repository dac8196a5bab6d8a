//! Pieces of a counted B+-tree, encoded (little-endian, stable: pieces are
//! stored in the heap).
//!
//! ```text
//! piece  = u8 kind (1 leaf, 2 inner) ‖ u16 n ‖ n entries
//! leaf entry,  positional = varint len ‖ bytes
//! leaf entry,  ordered    = f64 score (8 bytes) ‖ varint len ‖ member
//! inner entry, positional = u64 child ‖ u64 count
//! inner entry, ordered    = u64 child ‖ u64 count ‖ f64 low score ‖ varint len ‖ low member
//! ```
//! `varint` is unsigned LEB128 (at most 10 bytes). A positional tree (a list)
//! orders its elements by position alone; an ordered tree (a sorted set) by
//! (score, member) as Redis's skiplist does. An inner entry's `count` is the
//! number of elements under the child; in an ordered tree its `low` bounds the
//! child's keys from below (see [`super::tree`]).

use crate::{Error, Result};
use std::cmp::Ordering;

pub const LEAF: u8 = 1;
pub const INNER: u8 = 2;

/// An element of a leaf, or an inner entry's low key. A positional tree
/// leaves `score` at 0 and does not store it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub score: f64,
    pub bytes: Vec<u8>,
}

impl Entry {
    pub fn new(score: f64, bytes: Vec<u8>) -> Entry {
        Entry { score, bytes }
    }

    /// Redis's sorted-set order: by score (`-0.0` equals `0.0`), then by the
    /// member's bytes.
    pub fn cmp_key(&self, score: f64, member: &[u8]) -> Ordering {
        match self.score.partial_cmp(&score) {
            Some(Ordering::Equal) | None => self.bytes.as_slice().cmp(member),
            Some(o) => o,
        }
    }

    /// Bytes this entry takes in a leaf.
    pub fn encoded_len(&self, ordered: bool) -> usize {
        (if ordered { 8 } else { 0 }) + varint_len(self.bytes.len() as u64) + self.bytes.len()
    }
}

/// A child of an inner node.
#[derive(Clone, Debug, PartialEq)]
pub struct Child {
    pub id: u64,
    pub count: u64,
    /// Ordered trees: a lower bound of the child's keys (unused for child 0).
    pub low: Entry,
}

/// A decoded piece.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Leaf(Vec<Entry>),
    Inner(Vec<Child>),
}

impl Node {
    /// Elements under this node.
    pub fn count(&self) -> u64 {
        match self {
            Node::Leaf(v) => v.len() as u64,
            Node::Inner(v) => v.iter().fold(0u64, |a, c| a.saturating_add(c.count)),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Node::Leaf(v) => v.len(),
            Node::Inner(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn encode(&self, ordered: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        match self {
            Node::Leaf(v) => {
                out.push(LEAF);
                out.extend_from_slice(&(v.len() as u16).to_le_bytes());
                for e in v {
                    put_entry(&mut out, e, ordered);
                }
            }
            Node::Inner(v) => {
                out.push(INNER);
                out.extend_from_slice(&(v.len() as u16).to_le_bytes());
                for c in v {
                    put_child(&mut out, c, ordered);
                }
            }
        }
        out
    }

    pub fn decode(b: &[u8], ordered: bool) -> Result<Node> {
        let mut r = Reader { b, at: 0 };
        let kind = r.u8()?;
        let n = u16::from_le_bytes([r.u8()?, r.u8()?]) as usize;
        let node = match kind {
            LEAF => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(r.entry(ordered)?);
                }
                Node::Leaf(v)
            }
            INNER => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(r.child(ordered)?);
                }
                Node::Inner(v)
            }
            k => return Err(corrupt(format!("piece kind {k}"))),
        };
        if r.at != b.len() {
            return Err(corrupt("trailing bytes in a piece".into()));
        }
        Ok(node)
    }
}

pub(crate) fn corrupt(what: String) -> Error {
    Error::Corrupt(format!("collection piece: {what}"))
}

#[inline]
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

pub(crate) fn put_entry(out: &mut Vec<u8>, e: &Entry, ordered: bool) {
    if ordered {
        out.extend_from_slice(&e.score.to_le_bytes());
    }
    put_varint(out, e.bytes.len() as u64);
    out.extend_from_slice(&e.bytes);
}

pub(crate) fn put_child(out: &mut Vec<u8>, c: &Child, ordered: bool) {
    out.extend_from_slice(&c.id.to_le_bytes());
    out.extend_from_slice(&c.count.to_le_bytes());
    if ordered {
        put_entry(out, &c.low, true);
    }
}

/// Reads the encodings above out of a byte slice, failing on any
/// inconsistency (a corrupt piece is an error, never a panic).
pub(crate) struct Reader<'a> {
    pub b: &'a [u8],
    pub at: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    pub fn u8(&mut self) -> Result<u8> {
        let v = *self
            .b
            .get(self.at)
            .ok_or_else(|| corrupt("piece ends early".into()))?;
        self.at += 1;
        Ok(v)
    }

    #[inline]
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| corrupt("piece ends early".into()))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    #[inline]
    pub fn u64(&mut self) -> Result<u64> {
        let s = self.bytes(8)?;
        Ok(u64::from_le_bytes(s.try_into().expect("8 bytes")))
    }

    #[inline]
    pub fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt("varint longer than 10 bytes".into()))
    }

    /// A varint length and that many bytes.
    #[inline]
    pub fn blob(&mut self) -> Result<Vec<u8>> {
        let len = usize::try_from(self.varint()?).map_err(|_| corrupt("length".into()))?;
        Ok(self.bytes(len)?.to_vec())
    }

    #[inline]
    pub fn entry(&mut self, ordered: bool) -> Result<Entry> {
        let score = if ordered {
            f64::from_bits(self.u64()?)
        } else {
            0.0
        };
        let len = self.varint()?;
        let len = usize::try_from(len).map_err(|_| corrupt("entry length".into()))?;
        Ok(Entry {
            score,
            bytes: self.bytes(len)?.to_vec(),
        })
    }

    #[inline]
    pub fn child(&mut self, ordered: bool) -> Result<Child> {
        let id = self.u64()?;
        let count = self.u64()?;
        let low = if ordered {
            self.entry(true)?
        } else {
            Entry::new(0.0, Vec::new())
        };
        Ok(Child { id, count, low })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_lengths() {
        for v in [0u64, 1, 127, 128, 16383, 16384, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            let mut r = Reader { b: &out, at: 0 };
            assert_eq!(r.varint().unwrap(), v);
        }
    }

    #[test]
    fn nodes_round_trip_and_garbage_is_an_error() {
        for ordered in [false, true] {
            let leaf = Node::Leaf(vec![
                Entry::new(if ordered { 1.5 } else { 0.0 }, b"a".to_vec()),
                Entry::new(if ordered { -2.0 } else { 0.0 }, vec![7; 300]),
            ]);
            let inner = Node::Inner(vec![Child {
                id: 9,
                count: 1 << 40,
                low: Entry::new(
                    if ordered { 3.0 } else { 0.0 },
                    if ordered { b"m".to_vec() } else { vec![] },
                ),
            }]);
            for n in [leaf, inner] {
                let b = n.encode(ordered);
                assert_eq!(Node::decode(&b, ordered).unwrap(), n);
                for cut in 0..b.len() {
                    assert!(Node::decode(&b[..cut], ordered).is_err());
                }
            }
        }
        assert!(Node::decode(&[9, 0, 0], false).is_err());
    }
}
