//! A collection's head value: what the user's key holds (after the server's
//! tag and expiry bytes). Little-endian, stable:
//!
//! ```text
//! u8 encoding ‖ body
//!   1 INLINE: the whole collection as one bucket piece (lhash::Bucket:
//!             pairs in insertion order; a set's values are empty)
//!   2 TABLE:  u64 id ‖ u32 level ‖ u64 split ‖ u64 count: a linear-hashing
//!             table of bucket pieces under the internal keys of `id`,
//!             hashed with seed `id`
//!   3 LIST_INLINE: the whole list as one positional leaf (tree::node)
//!   4 LIST_TREE:   u64 id ‖ u64 root ‖ u32 height ‖ u64 next id ‖ u64 count:
//!             a positional counted B+-tree of pieces under the keys of `id`
//!   5 ZSET_INLINE: the whole sorted set as one ordered leaf (tree::node),
//!             elements in (score, member) order
//!   6 ZSET_TREE: u64 id ‖ u64 root ‖ u32 height ‖ u64 next id ‖ u64 count
//!             ‖ u32 level ‖ u64 split ‖ u64 count: an ordered counted
//!             B+-tree (the order, ranks) and a linear-hashing table
//!             (member -> score as 8 bytes f64 LE), both under the keys of
//!             `id` (tree pieces 1.., table buckets `lhash::BUCKET_ID | b`)
//! ```

use super::lhash::{self, Bucket};
use super::node::{corrupt, Entry, Node, Reader};
use super::tree;
use crate::Result;

pub const INLINE: u8 = 1;
pub const TABLE: u8 = 2;
pub const LIST_INLINE: u8 = 3;
pub const LIST_TREE: u8 = 4;
pub const ZSET_INLINE: u8 = 5;
pub const ZSET_TREE: u8 = 6;

/// A hash's or a set's head.
#[derive(Clone, Debug, PartialEq)]
pub enum MapHead {
    /// Small: every pair in the head (Redis's listpack encoding).
    Inline(Bucket),
    /// Large: pieces of a table (Redis's hashtable encoding).
    Table { id: u64, meta: lhash::Meta },
}

impl MapHead {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            MapHead::Inline(b) => {
                out.push(INLINE);
                out.extend_from_slice(&b.encode());
            }
            MapHead::Table { id, meta } => {
                out.push(TABLE);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&meta.level.to_le_bytes());
                out.extend_from_slice(&meta.split.to_le_bytes());
                out.extend_from_slice(&meta.count.to_le_bytes());
            }
        }
    }

    pub fn decode(b: &[u8]) -> Result<MapHead> {
        match b.first() {
            Some(&INLINE) => Ok(MapHead::Inline(Bucket::decode(&b[1..])?)),
            Some(&TABLE) => {
                let mut r = Reader { b: &b[1..], at: 0 };
                let id = r.u64()?;
                let level = u32::from_le_bytes(r.bytes(4)?.try_into().expect("4 bytes"));
                let split = r.u64()?;
                let count = r.u64()?;
                if r.at != r.b.len() || level >= 63 || split >= 1u64 << level {
                    return Err(corrupt("table head".into()));
                }
                Ok(MapHead::Table {
                    id,
                    meta: lhash::Meta {
                        level,
                        split,
                        count,
                        seed: id,
                    },
                })
            }
            _ => Err(corrupt("collection head encoding".into())),
        }
    }

    /// Elements in the collection.
    pub fn len(&self) -> u64 {
        match self {
            MapHead::Inline(b) => b.0.len() as u64,
            MapHead::Table { meta, .. } => meta.count,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A list's head.
#[derive(Clone, Debug, PartialEq)]
pub enum ListHead {
    /// Small: every element in the head.
    Inline(Vec<Entry>),
    /// Large: a positional tree of pieces.
    Tree { id: u64, meta: tree::Meta },
}

impl ListHead {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ListHead::Inline(v) => {
                out.push(LIST_INLINE);
                // The node encoding, without a copy of the elements.
                out.push(super::node::LEAF);
                out.extend_from_slice(&(v.len() as u16).to_le_bytes());
                for e in v {
                    super::node::put_entry(out, e, false);
                }
            }
            ListHead::Tree { id, meta } => {
                out.push(LIST_TREE);
                out.extend_from_slice(&id.to_le_bytes());
                put_tree_meta(out, meta);
            }
        }
    }

    pub fn decode(b: &[u8]) -> Result<ListHead> {
        match b.first() {
            Some(&LIST_INLINE) => match Node::decode(&b[1..], false)? {
                Node::Leaf(v) => Ok(ListHead::Inline(v)),
                Node::Inner(_) => Err(corrupt("list head".into())),
            },
            Some(&LIST_TREE) => {
                let mut r = Reader { b: &b[1..], at: 0 };
                let id = r.u64()?;
                let meta = read_tree_meta(&mut r)?;
                if r.at != r.b.len() {
                    return Err(corrupt("list tree head".into()));
                }
                Ok(ListHead::Tree { id, meta })
            }
            _ => Err(corrupt("list head encoding".into())),
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            ListHead::Inline(v) => v.len() as u64,
            ListHead::Tree { meta, .. } => meta.count,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A sorted set's head.
#[derive(Clone, Debug, PartialEq)]
pub enum ZsetHead {
    /// Small: every element in the head, in order (Redis's listpack).
    Inline(Vec<Entry>),
    /// Large: an ordered tree and a member table (Redis's skiplist + dict).
    Tree {
        id: u64,
        tree: tree::Meta,
        map: lhash::Meta,
    },
}

impl ZsetHead {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ZsetHead::Inline(v) => {
                out.push(ZSET_INLINE);
                out.push(super::node::LEAF);
                out.extend_from_slice(&(v.len() as u16).to_le_bytes());
                for e in v {
                    super::node::put_entry(out, e, true);
                }
            }
            ZsetHead::Tree { id, tree, map } => {
                out.push(ZSET_TREE);
                out.extend_from_slice(&id.to_le_bytes());
                put_tree_meta(out, tree);
                out.extend_from_slice(&map.level.to_le_bytes());
                out.extend_from_slice(&map.split.to_le_bytes());
                out.extend_from_slice(&map.count.to_le_bytes());
            }
        }
    }

    pub fn decode(b: &[u8]) -> Result<ZsetHead> {
        match b.first() {
            Some(&ZSET_INLINE) => match Node::decode(&b[1..], true)? {
                Node::Leaf(v) => Ok(ZsetHead::Inline(v)),
                Node::Inner(_) => Err(corrupt("sorted set head".into())),
            },
            Some(&ZSET_TREE) => {
                let mut r = Reader { b: &b[1..], at: 0 };
                let id = r.u64()?;
                let tree = read_tree_meta(&mut r)?;
                let level = u32::from_le_bytes(r.bytes(4)?.try_into().expect("4 bytes"));
                let split = r.u64()?;
                let map_count = r.u64()?;
                if r.at != r.b.len()
                    || level >= 63
                    || split >= 1u64 << level
                    || map_count != tree.count
                    || tree.next_id >= lhash::BUCKET_ID
                {
                    return Err(corrupt("sorted set tree head".into()));
                }
                Ok(ZsetHead::Tree {
                    id,
                    tree,
                    map: lhash::Meta {
                        level,
                        split,
                        count: map_count,
                        seed: id,
                    },
                })
            }
            _ => Err(corrupt("sorted set head encoding".into())),
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            ZsetHead::Inline(v) => v.len() as u64,
            ZsetHead::Tree { tree, .. } => tree.count,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A tree's root state: u64 root ‖ u32 height ‖ u64 next id ‖ u64 count.
pub(crate) fn put_tree_meta(out: &mut Vec<u8>, m: &tree::Meta) {
    out.extend_from_slice(&m.root.to_le_bytes());
    out.extend_from_slice(&m.height.to_le_bytes());
    out.extend_from_slice(&m.next_id.to_le_bytes());
    out.extend_from_slice(&m.count.to_le_bytes());
}

pub(crate) fn read_tree_meta(r: &mut Reader) -> Result<tree::Meta> {
    let root = r.u64()?;
    let height = u32::from_le_bytes(r.bytes(4)?.try_into().expect("4 bytes"));
    let next_id = r.u64()?;
    let count = r.u64()?;
    if height > 64 || (root == 0) != (height == 0) {
        return Err(corrupt("tree head".into()));
    }
    Ok(tree::Meta {
        root,
        height,
        next_id,
        count,
    })
}

/// The store key of piece `piece` of collection `id`: a first byte (0xFF)
/// that no user key's store key has, then both numbers big-endian.
pub fn piece_key(id: u64, piece: u64, out: &mut Vec<u8>) {
    out.clear();
    out.push(PIECE_PREFIX);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&piece.to_be_bytes());
}

/// The first byte of every piece's store key.
pub const PIECE_PREFIX: u8 = 0xFF;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_round_trip_and_garbage_is_an_error() {
        let heads = [
            MapHead::Inline(Bucket(vec![(b"f".to_vec(), b"v".to_vec())])),
            MapHead::Table {
                id: 77,
                meta: lhash::Meta {
                    level: 5,
                    split: 3,
                    count: 1234,
                    seed: 77,
                },
            },
        ];
        for h in heads {
            let mut b = Vec::new();
            h.encode(&mut b);
            assert_eq!(MapHead::decode(&b).unwrap(), h);
            for cut in 0..b.len() {
                assert!(MapHead::decode(&b[..cut]).is_err());
            }
        }
        assert!(MapHead::decode(&[2; 29]).is_err());
        let lists = [
            ListHead::Inline(vec![
                Entry::new(0.0, b"a".to_vec()),
                Entry::new(0.0, vec![]),
            ]),
            ListHead::Tree {
                id: 9,
                meta: tree::Meta {
                    root: 3,
                    height: 2,
                    next_id: 7,
                    count: 300,
                },
            },
        ];
        for h in lists {
            let mut b = Vec::new();
            h.encode(&mut b);
            assert_eq!(ListHead::decode(&b).unwrap(), h);
            for cut in 0..b.len() {
                assert!(ListHead::decode(&b[..cut]).is_err());
            }
        }
        let zsets = [
            ZsetHead::Inline(vec![
                Entry::new(-1.5, b"a".to_vec()),
                Entry::new(f64::INFINITY, vec![]),
            ]),
            ZsetHead::Tree {
                id: 11,
                tree: tree::Meta {
                    root: 3,
                    height: 2,
                    next_id: 7,
                    count: 300,
                },
                map: lhash::Meta {
                    level: 3,
                    split: 1,
                    count: 300,
                    seed: 11,
                },
            },
        ];
        for h in zsets {
            let mut b = Vec::new();
            h.encode(&mut b);
            assert_eq!(ZsetHead::decode(&b).unwrap(), h);
            for cut in 0..b.len() {
                assert!(ZsetHead::decode(&b[..cut]).is_err());
            }
        }
    }
}
