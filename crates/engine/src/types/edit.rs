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

use super::lhash::Bucket;
use super::node::{corrupt, put_entry, put_varint, Entry, Node, Reader};
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
    pub fn apply(&self, ordered: bool, old: &[u8]) -> Result<Vec<u8>> {
        match self {
            Edit::BucketSet { field, value } => {
                let mut b = Bucket::decode(old)?;
                b.set(field, value);
                return Ok(b.encode());
            }
            Edit::BucketDel { field } => {
                let mut b = Bucket::decode(old)?;
                b.del(field);
                return Ok(b.encode());
            }
            _ => {}
        }
        let mut node = Node::decode(old, ordered)?;
        self.apply_to(&mut node)?;
        Ok(node.encode(ordered))
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
}
