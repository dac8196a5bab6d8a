//! Edits of a piece: what a command records instead of the piece's new bytes
//! (a merge operation: the log carries the edit, a few bytes, and whoever
//! applies the record (the writer in DRAM, a gleaner, recovery) computes the
//! same new piece from the old one).
//!
//! ```text
//! edit = u8 code ‖ u8 ordered (0|1) ‖ u32 pos ‖ rest
//!   1 LeafInsert: rest = entry (as in a leaf)
//!   2 LeafRemove: rest = nothing
//!   3 LeafSet:    rest = entry
//!   4 ChildAdd:   rest = i64 delta (pos = the child's index)
//!   5 BucketSet:  rest = varint len ‖ field ‖ varint len ‖ value (pos 0)
//!   6 BucketDel:  rest = varint len ‖ field (pos 0)
//! ```
//! Edits are deterministic; the tree's are not idempotent (the bucket edits
//! are): they are applied exactly once and in order (the stores' rule for
//! non-idempotent operations).

use super::node::{corrupt, put_entry, put_varint, Entry, Node, Reader, INNER, LEAF};
use crate::Result;

#[derive(Clone, Debug, PartialEq)]
pub enum Edit {
    /// Inserts an element at a leaf position.
    LeafInsert { pos: u32, entry: Entry },
    /// Removes the element at a leaf position.
    LeafRemove { pos: u32 },
    /// Replaces the element at a leaf position.
    LeafSet { pos: u32, entry: Entry },
    /// Adds `delta` to the count of an inner node's child `idx`.
    ChildAdd { idx: u32, delta: i64 },
    /// Sets a field of a hash bucket (inserted or replaced).
    BucketSet { field: Vec<u8>, value: Vec<u8> },
    /// Deletes a field of a hash bucket, if there.
    BucketDel { field: Vec<u8> },
}

const LEAF_INSERT: u8 = 1;
const LEAF_REMOVE: u8 = 2;
const LEAF_SET: u8 = 3;
const CHILD_ADD: u8 = 4;
const BUCKET_SET: u8 = 5;
const BUCKET_DEL: u8 = 6;

impl Edit {
    pub fn encode(&self, ordered: bool, out: &mut Vec<u8>) {
        let (code, pos) = match self {
            Edit::LeafInsert { pos, .. } => (LEAF_INSERT, *pos),
            Edit::LeafRemove { pos } => (LEAF_REMOVE, *pos),
            Edit::LeafSet { pos, .. } => (LEAF_SET, *pos),
            Edit::ChildAdd { idx, .. } => (CHILD_ADD, *idx),
            Edit::BucketSet { .. } => (BUCKET_SET, 0),
            Edit::BucketDel { .. } => (BUCKET_DEL, 0),
        };
        out.push(code);
        out.push(ordered as u8);
        out.extend_from_slice(&pos.to_le_bytes());
        match self {
            Edit::LeafInsert { entry, .. } | Edit::LeafSet { entry, .. } => {
                put_entry(out, entry, ordered)
            }
            Edit::LeafRemove { .. } => {}
            Edit::ChildAdd { delta, .. } => out.extend_from_slice(&delta.to_le_bytes()),
            Edit::BucketSet { field, value } => {
                put_varint(out, field.len() as u64);
                out.extend_from_slice(field);
                put_varint(out, value.len() as u64);
                out.extend_from_slice(value);
            }
            Edit::BucketDel { field } => {
                put_varint(out, field.len() as u64);
                out.extend_from_slice(field);
            }
        }
    }

    /// Decodes an edit and whether it applies to an ordered tree's piece.
    pub fn decode(b: &[u8]) -> Result<(Edit, bool)> {
        let mut r = Reader { b, at: 0 };
        let code = r.u8()?;
        let ordered = match r.u8()? {
            0 => false,
            1 => true,
            x => return Err(corrupt(format!("edit flag {x}"))),
        };
        let pos = u32::from_le_bytes(r.bytes(4)?.try_into().expect("4 bytes"));
        let e = match code {
            LEAF_INSERT => Edit::LeafInsert {
                pos,
                entry: r.entry(ordered)?,
            },
            LEAF_REMOVE => Edit::LeafRemove { pos },
            LEAF_SET => Edit::LeafSet {
                pos,
                entry: r.entry(ordered)?,
            },
            CHILD_ADD => Edit::ChildAdd {
                idx: pos,
                delta: r.u64()? as i64,
            },
            BUCKET_SET => {
                let field = r.blob()?;
                Edit::BucketSet {
                    field,
                    value: r.blob()?,
                }
            }
            BUCKET_DEL => Edit::BucketDel { field: r.blob()? },
            c => return Err(corrupt(format!("edit code {c}"))),
        };
        if r.at != b.len() {
            return Err(corrupt("trailing bytes in an edit".into()));
        }
        Ok((e, ordered))
    }

    /// The piece after this edit. An edit that does not fit the piece (a
    /// position past its end, a leaf edit on an inner node, a count that would
    /// go negative) is corruption, reported as an error.
    ///
    /// Works on the encoded bytes: one pass checks the whole piece (as a
    /// decode would) and finds the span the edit touches, then the bytes are
    /// spliced, with no per-element allocation. The result is the bytes that
    /// decoding, editing and encoding again would give (the encoding is
    /// canonical). Every store applies edits this way (the writer, the
    /// gleaners, recovery), so an element write costs a copy of its piece,
    /// not a decode and an encode of it.
    pub fn apply(&self, ordered: bool, old: &[u8]) -> Result<Vec<u8>> {
        let bad = || corrupt(format!("edit {self:?} does not fit its piece"));
        match self {
            Edit::BucketSet { field, value } => {
                let (n, span) = bucket_span(old, field)?;
                let mut enc = Vec::with_capacity(field.len() + value.len() + 4);
                put_varint(&mut enc, field.len() as u64);
                enc.extend_from_slice(field);
                put_varint(&mut enc, value.len() as u64);
                enc.extend_from_slice(value);
                match span {
                    Some((start, end)) => Ok(splice(old, start, end, &enc, n)),
                    None => {
                        let n = n.checked_add(1).ok_or_else(bad)?;
                        Ok(splice(old, old.len(), old.len(), &enc, n))
                    }
                }
            }
            Edit::BucketDel { field } => {
                let (n, span) = bucket_span(old, field)?;
                Ok(match span {
                    Some((start, end)) => splice(old, start, end, &[], n - 1),
                    None => old.to_vec(),
                })
            }
            Edit::LeafInsert { pos, entry } => {
                let (n, start, _) = node_span(old, ordered, LEAF, *pos).map_err(|_| bad())?;
                let n = n.checked_add(1).ok_or_else(bad)?;
                let mut enc = Vec::with_capacity(entry.encoded_len(ordered));
                put_entry(&mut enc, entry, ordered);
                Ok(splice(old, start, start, &enc, n))
            }
            Edit::LeafRemove { pos } => {
                let (n, start, end) = node_span(old, ordered, LEAF, *pos).map_err(|_| bad())?;
                if *pos as usize >= n as usize {
                    return Err(bad());
                }
                Ok(splice(old, start, end, &[], n - 1))
            }
            Edit::LeafSet { pos, entry } => {
                let (n, start, end) = node_span(old, ordered, LEAF, *pos).map_err(|_| bad())?;
                if *pos as usize >= n as usize {
                    return Err(bad());
                }
                let mut enc = Vec::with_capacity(entry.encoded_len(ordered));
                put_entry(&mut enc, entry, ordered);
                Ok(splice(old, start, end, &enc, n))
            }
            Edit::ChildAdd { idx, delta } => {
                let (n, start, _) = node_span(old, ordered, INNER, *idx).map_err(|_| bad())?;
                if *idx as usize >= n as usize {
                    return Err(bad());
                }
                let at = start + 8;
                let count = u64::from_le_bytes(old[at..at + 8].try_into().expect("8 bytes"));
                let count = count.checked_add_signed(*delta).ok_or_else(bad)?;
                let mut out = old.to_vec();
                out[at..at + 8].copy_from_slice(&count.to_le_bytes());
                Ok(out)
            }
        }
    }

    /// Applies the edit to a decoded piece.
    pub fn apply_to(&self, node: &mut Node) -> Result<()> {
        let bad = || corrupt(format!("edit {self:?} does not fit its piece"));
        match (self, node) {
            (Edit::LeafInsert { pos, entry }, Node::Leaf(v)) if (*pos as usize) <= v.len() => {
                v.insert(*pos as usize, entry.clone())
            }
            (Edit::LeafRemove { pos }, Node::Leaf(v)) if (*pos as usize) < v.len() => {
                v.remove(*pos as usize);
            }
            (Edit::LeafSet { pos, entry }, Node::Leaf(v)) if (*pos as usize) < v.len() => {
                v[*pos as usize] = entry.clone()
            }
            (Edit::ChildAdd { idx, delta }, Node::Inner(v)) if (*idx as usize) < v.len() => {
                let c = &mut v[*idx as usize];
                c.count = c.count.checked_add_signed(*delta).ok_or_else(bad)?;
            }
            _ => return Err(bad()),
        }
        Ok(())
    }
}

/// `old` with `old[start..end]` replaced by `with` and its count (the u16
/// after the kind byte) set to `n`.
fn splice(old: &[u8], start: usize, end: usize, with: &[u8], n: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(old.len() - (end - start) + with.len());
    out.extend_from_slice(&old[..start]);
    out.extend_from_slice(with);
    out.extend_from_slice(&old[end..]);
    out[1..3].copy_from_slice(&n.to_le_bytes());
    out
}

/// Checks a whole tree piece of `kind` (as `Node::decode` would) and returns
/// its element count and the byte span of entry `pos` (`pos == n`: the
/// empty span at the end).
fn node_span(b: &[u8], ordered: bool, kind: u8, pos: u32) -> Result<(u16, usize, usize)> {
    let mut r = Reader { b, at: 0 };
    if r.u8()? != kind {
        return Err(corrupt("piece kind".into()));
    }
    let n = u16::from_le_bytes([r.u8()?, r.u8()?]);
    if pos as usize > n as usize {
        return Err(corrupt("position past the piece".into()));
    }
    let (mut start, mut end) = (b.len(), b.len());
    for i in 0..n as usize {
        if i == pos as usize {
            start = r.at;
        }
        if kind == INNER {
            r.bytes(16)?;
        }
        if kind == LEAF || ordered {
            if ordered {
                r.bytes(8)?;
            }
            let len = usize::try_from(r.varint()?).map_err(|_| corrupt("length".into()))?;
            r.bytes(len)?;
        }
        if i == pos as usize {
            end = r.at;
        }
    }
    if r.at != b.len() {
        return Err(corrupt("trailing bytes in a piece".into()));
    }
    Ok((n, start, end))
}

/// Checks a whole bucket piece (as `Bucket::decode` would) and returns its
/// pair count and the byte span of `field`'s pair, if there.
fn bucket_span(b: &[u8], field: &[u8]) -> Result<(u16, Option<(usize, usize)>)> {
    let mut r = Reader { b, at: 0 };
    if r.u8()? != super::lhash::BUCKET {
        return Err(corrupt("not a bucket piece".into()));
    }
    let n = u16::from_le_bytes([r.u8()?, r.u8()?]);
    let mut span = None;
    for _ in 0..n {
        let start = r.at;
        let fl = usize::try_from(r.varint()?).map_err(|_| corrupt("field length".into()))?;
        let f = r.bytes(fl)?;
        let vl = usize::try_from(r.varint()?).map_err(|_| corrupt("value length".into()))?;
        r.bytes(vl)?;
        if span.is_none() && f == field {
            span = Some((start, r.at));
        }
    }
    if r.at != b.len() {
        return Err(corrupt("trailing bytes in a bucket".into()));
    }
    Ok((n, span))
}

#[cfg(test)]
mod tests {
    use super::super::node::Child;
    use super::*;

    #[test]
    fn edits_round_trip_and_apply() {
        let leaf = Node::Leaf(vec![Entry::new(1.0, b"a".to_vec())]).encode(true);
        let ins = Edit::LeafInsert {
            pos: 1,
            entry: Entry::new(2.0, b"b".to_vec()),
        };
        let mut b = Vec::new();
        ins.encode(true, &mut b);
        assert_eq!(Edit::decode(&b).unwrap(), (ins.clone(), true));
        let new = ins.apply(true, &leaf).unwrap();
        assert_eq!(
            Node::decode(&new, true).unwrap(),
            Node::Leaf(vec![
                Entry::new(1.0, b"a".to_vec()),
                Entry::new(2.0, b"b".to_vec())
            ])
        );
        // Positions past the end and edits of the wrong kind are errors.
        assert!(Edit::LeafRemove { pos: 5 }.apply(true, &leaf).is_err());
        assert!(Edit::ChildAdd { idx: 0, delta: 1 }
            .apply(true, &leaf)
            .is_err());
        let inner = Node::Inner(vec![Child {
            id: 3,
            count: 1,
            low: Entry::new(0.0, vec![]),
        }])
        .encode(false);
        assert!(Edit::ChildAdd { idx: 0, delta: -2 }
            .apply(false, &inner)
            .is_err());
        let e = Edit::ChildAdd { idx: 0, delta: -1 };
        let mut b = Vec::new();
        e.encode(false, &mut b);
        assert_eq!(Edit::decode(&b).unwrap(), (e, false));
        for cut in 0..b.len() {
            assert!(Edit::decode(&b[..cut]).is_err());
        }
    }

    /// The reference: decode, edit, encode.
    fn reference(e: &Edit, ordered: bool, old: &[u8]) -> Result<Vec<u8>> {
        match e {
            Edit::BucketSet { field, value } => {
                let mut b = super::super::lhash::Bucket::decode(old)?;
                b.set(field, value);
                Ok(b.encode())
            }
            Edit::BucketDel { field } => {
                let mut b = super::super::lhash::Bucket::decode(old)?;
                b.del(field);
                Ok(b.encode())
            }
            _ => {
                let mut node = Node::decode(old, ordered)?;
                e.apply_to(&mut node)?;
                Ok(node.encode(ordered))
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Edits applied on the bytes give what decode, edit, encode gives,
        /// errors included, on leaves, inner nodes and buckets.
        #[test]
        fn byte_edits_match_decode_edit_encode(
            ordered in proptest::bool::ANY,
            elems in proptest::collection::vec((proptest::num::f64::ANY, proptest::collection::vec(0u8..4, 0..6)), 0..12),
            kind in 0u8..3,
            code in 0u8..6,
            pos in 0u32..14,
            delta in -5i64..5,
            field in proptest::collection::vec(0u8..4, 0..3),
            cut in proptest::option::of(0usize..200),
        ) {
            let old = match kind {
                0 => Node::Leaf(elems.iter().map(|(s, b)| Entry::new(if ordered { *s } else { 0.0 }, b.clone())).collect()).encode(ordered),
                1 => Node::Inner(elems.iter().enumerate().map(|(i, (s, b))| Child {
                    id: i as u64 + 1,
                    count: b.len() as u64,
                    low: Entry::new(if ordered { *s } else { 0.0 }, if ordered { b.clone() } else { vec![] }),
                }).collect()).encode(ordered),
                _ => super::super::lhash::Bucket(elems.iter().map(|(_, b)| (b.clone(), vec![7])).collect()).encode(),
            };
            // Sometimes a truncated (corrupt) piece.
            let old = match cut {
                Some(c) if c < old.len() => old[..c].to_vec(),
                _ => old,
            };
            let entry = Entry::new(if ordered { 2.5 } else { 0.0 }, field.clone());
            let e = match code {
                0 => Edit::LeafInsert { pos, entry },
                1 => Edit::LeafRemove { pos },
                2 => Edit::LeafSet { pos, entry },
                3 => Edit::ChildAdd { idx: pos, delta },
                4 => Edit::BucketSet { field: field.clone(), value: vec![9, 9] },
                _ => Edit::BucketDel { field: field.clone() },
            };
            let got = e.apply(ordered, &old);
            let want = reference(&e, ordered, &old);
            match (&got, &want) {
                (Ok(g), Ok(w)) => proptest::prop_assert_eq!(g, w),
                (Err(_), Err(_)) => {}
                _ => proptest::prop_assert!(false, "{e:?} on {old:?}: {got:?} vs {want:?}"),
            }
        }
    }
}
