//! Redis streams as pieces: a stream's head value and the encodings of its
//! entries and pending entries.
//!
//! A stream is an ordered counted B+-tree ([`super::tree`]) of its entries,
//! each one element whose member is the entry's ID (16 bytes, big-endian:
//! byte order is ID order) followed by its field-value pairs, all with
//! score 0 (so the tree orders by member, that is by ID; inner nodes keep
//! only the 16-byte ID of their children's low entries:
//! [`super::tree::Tree::with_low_prefix`]). Each consumer group has a
//! pending entries list (PEL) of its own, an ordered tree of the same kind
//! whose members are an ID, the last delivery time, the delivery count and
//! the consumer's name. All the trees live under the stream's collection id;
//! each tree takes its piece ids from its own range (`slot << SLOT_SHIFT`),
//! so their pieces never collide. The head (this module's [`StreamHead`])
//! holds the trees' roots and everything else Redis keeps per stream:
//! the last ID, the largest deleted ID, the entries-added counter and the
//! groups with their consumers (in name order, as Redis's radix trees list
//! them).
//!
//! ```text
//! head: u8 7 ‖ u64 id ‖ tree meta (entries) ‖ id last ‖ id max deleted
//!       ‖ u64 entries added ‖ u64 next slot ‖ varint groups ‖ group*
//! group: blob name ‖ id last delivered ‖ i64 entries read (-1: unknown)
//!       ‖ tree meta (PEL) ‖ varint consumers ‖ consumer*
//! consumer: blob name ‖ i64 seen time (Unix ms) ‖ u64 pending
//! id: u64 ms ‖ u64 seq (little-endian in the head; big-endian in members)
//! entry member: id (BE) ‖ varint pairs ‖ (blob field ‖ blob value)*
//! PEL member: id (BE) ‖ i64 delivery time (LE) ‖ u64 deliveries (LE) ‖ consumer name
//! ```

use super::node::{corrupt, put_varint, Reader};
use super::tree;
use crate::Result;

pub const STREAM: u8 = 7;

/// A tree's piece ids start at `slot << SLOT_SHIFT` (slot 0: the entries;
/// each group's PEL a slot of its own, never reused within the stream).
pub const SLOT_SHIFT: u32 = 40;

/// A stream entry ID.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sid {
    pub ms: u64,
    pub seq: u64,
}

impl Sid {
    pub const MIN: Sid = Sid { ms: 0, seq: 0 };
    pub const MAX: Sid = Sid {
        ms: u64::MAX,
        seq: u64::MAX,
    };

    pub fn new(ms: u64, seq: u64) -> Sid {
        Sid { ms, seq }
    }

    /// The next ID (None after the last possible one).
    pub fn next(self) -> Option<Sid> {
        if self.seq == u64::MAX {
            (self.ms != u64::MAX).then(|| Sid::new(self.ms + 1, 0))
        } else {
            Some(Sid::new(self.ms, self.seq + 1))
        }
    }

    /// The previous ID (None before 0-0).
    pub fn prev(self) -> Option<Sid> {
        if self.seq == 0 {
            (self.ms != 0).then(|| Sid::new(self.ms - 1, u64::MAX))
        } else {
            Some(Sid::new(self.ms, self.seq - 1))
        }
    }

    /// The 16 bytes that order as the IDs do.
    pub fn be(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.ms.to_be_bytes());
        b[8..].copy_from_slice(&self.seq.to_be_bytes());
        b
    }

    /// The ID at the front of a member.
    pub fn from_be(b: &[u8]) -> Result<Sid> {
        let b: &[u8; 16] = b
            .get(..16)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| corrupt("stream member shorter than an ID".into()))?;
        Ok(Sid::new(
            u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
            u64::from_be_bytes(b[8..].try_into().expect("8 bytes")),
        ))
    }

    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ms.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
    }

    fn read(r: &mut Reader) -> Result<Sid> {
        Ok(Sid::new(r.u64()?, r.u64()?))
    }
}

impl std::fmt::Display for Sid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// A consumer of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumer {
    pub name: Vec<u8>,
    /// When it last read or claimed (Unix ms; XINFO CONSUMERS' idle).
    pub seen: i64,
    /// Its entries in the group's PEL.
    pub pending: u64,
}

/// A consumer group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub name: Vec<u8>,
    pub last: Sid,
    /// Entries read (Redis's `entries_read`); -1 when unknown.
    pub entries_read: i64,
    pub pel: tree::Meta,
    /// In name order.
    pub consumers: Vec<Consumer>,
}

impl Group {
    /// A new group with an empty PEL in piece slot `slot`.
    pub fn new(name: Vec<u8>, last: Sid, entries_read: i64, slot: u64) -> Group {
        let mut pel = tree::Meta::new();
        pel.next_id = (slot << SLOT_SHIFT) | 1;
        Group {
            name,
            last,
            entries_read,
            pel,
            consumers: Vec::new(),
        }
    }

    /// The consumer's index, or where it would be inserted.
    pub fn consumer(&self, name: &[u8]) -> std::result::Result<usize, usize> {
        self.consumers
            .binary_search_by(|c| c.name.as_slice().cmp(name))
    }
}

/// A stream's head value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamHead {
    /// The collection id its pieces live under.
    pub id: u64,
    pub entries: tree::Meta,
    pub last: Sid,
    pub max_deleted: Sid,
    pub entries_added: u64,
    /// The next piece slot a new group's PEL takes.
    pub next_slot: u64,
    /// In name order.
    pub groups: Vec<Group>,
}

impl StreamHead {
    /// An empty stream under collection id `id`.
    pub fn new(id: u64) -> StreamHead {
        StreamHead {
            id,
            entries: tree::Meta::new(),
            last: Sid::MIN,
            max_deleted: Sid::MIN,
            entries_added: 0,
            next_slot: 1,
            groups: Vec::new(),
        }
    }

    /// The group's index, or where it would be inserted.
    pub fn group(&self, name: &[u8]) -> std::result::Result<usize, usize> {
        self.groups
            .binary_search_by(|g| g.name.as_slice().cmp(name))
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(STREAM);
        out.extend_from_slice(&self.id.to_le_bytes());
        super::head::put_tree_meta(out, &self.entries);
        self.last.put(out);
        self.max_deleted.put(out);
        out.extend_from_slice(&self.entries_added.to_le_bytes());
        out.extend_from_slice(&self.next_slot.to_le_bytes());
        put_varint(out, self.groups.len() as u64);
        for g in &self.groups {
            put_blob(out, &g.name);
            g.last.put(out);
            out.extend_from_slice(&g.entries_read.to_le_bytes());
            super::head::put_tree_meta(out, &g.pel);
            put_varint(out, g.consumers.len() as u64);
            for c in &g.consumers {
                put_blob(out, &c.name);
                out.extend_from_slice(&c.seen.to_le_bytes());
                out.extend_from_slice(&c.pending.to_le_bytes());
            }
        }
    }

    pub fn decode(b: &[u8]) -> Result<StreamHead> {
        if b.first() != Some(&STREAM) {
            return Err(corrupt("stream head encoding".into()));
        }
        let mut r = Reader { b: &b[1..], at: 0 };
        let id = r.u64()?;
        let entries = super::head::read_tree_meta(&mut r)?;
        let last = Sid::read(&mut r)?;
        let max_deleted = Sid::read(&mut r)?;
        let entries_added = r.u64()?;
        let next_slot = r.u64()?;
        let n = r.varint()?;
        let mut groups = Vec::new();
        for _ in 0..n {
            let name = r.blob()?;
            let glast = Sid::read(&mut r)?;
            let entries_read = r.u64()? as i64;
            let pel = super::head::read_tree_meta(&mut r)?;
            let m = r.varint()?;
            let mut consumers = Vec::new();
            for _ in 0..m {
                let cname = r.blob()?;
                let seen = r.u64()? as i64;
                let pending = r.u64()?;
                consumers.push(Consumer {
                    name: cname,
                    seen,
                    pending,
                });
            }
            groups.push(Group {
                name,
                last: glast,
                entries_read,
                pel,
                consumers,
            });
        }
        if r.at != r.b.len() || next_slot >= 1 << (64 - SLOT_SHIFT) {
            return Err(corrupt("stream head".into()));
        }
        Ok(StreamHead {
            id,
            entries,
            last,
            max_deleted,
            entries_added,
            next_slot,
            groups,
        })
    }
}

fn put_blob(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// An entry's member: its ID and field-value pairs.
pub fn entry_member(id: Sid, pairs: &[(&[u8], &[u8])]) -> Vec<u8> {
    let len: usize = pairs.iter().map(|(f, v)| f.len() + v.len() + 10).sum();
    let mut out = Vec::with_capacity(16 + 5 + len);
    out.extend_from_slice(&id.be());
    put_varint(&mut out, pairs.len() as u64);
    for (f, v) in pairs {
        put_blob(&mut out, f);
        put_blob(&mut out, v);
    }
    out
}

/// An entry's field-value pairs.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// An entry's ID and field-value pairs, from its member.
pub fn decode_entry(m: &[u8]) -> Result<(Sid, Pairs)> {
    let id = Sid::from_be(m)?;
    let mut r = Reader { b: &m[16..], at: 0 };
    let n = r.varint()?;
    let mut pairs = Vec::with_capacity(n.min(1024) as usize);
    for _ in 0..n {
        let f = r.blob()?;
        let v = r.blob()?;
        pairs.push((f, v));
    }
    if r.at != r.b.len() {
        return Err(corrupt("stream entry".into()));
    }
    Ok((id, pairs))
}

/// A pending entry: who has it since when, and how many deliveries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub id: Sid,
    pub delivered: i64,
    pub count: u64,
    pub consumer: Vec<u8>,
}

impl Pending {
    pub fn member(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.consumer.len());
        out.extend_from_slice(&self.id.be());
        out.extend_from_slice(&self.delivered.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.consumer);
        out
    }

    pub fn decode(m: &[u8]) -> Result<Pending> {
        let id = Sid::from_be(m)?;
        let rest = m
            .get(16..32)
            .ok_or_else(|| corrupt("pending entry".into()))?;
        Ok(Pending {
            id,
            delivered: i64::from_le_bytes(rest[..8].try_into().expect("8 bytes")),
            count: u64::from_le_bytes(rest[8..].try_into().expect("8 bytes")),
            consumer: m[32..].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_entries_and_pending_round_trip() {
        let mut h = StreamHead::new(9);
        h.last = Sid::new(5, 2);
        h.entries.count = 3;
        h.entries.root = 4;
        h.entries.height = 1;
        let mut g = Group::new(b"g".to_vec(), Sid::new(1, 1), -1, 1);
        g.consumers.push(Consumer {
            name: b"alice".to_vec(),
            seen: 1234,
            pending: 2,
        });
        h.groups.push(g);
        let mut b = Vec::new();
        h.encode(&mut b);
        assert_eq!(StreamHead::decode(&b).unwrap(), h);
        for cut in 0..b.len() {
            assert!(StreamHead::decode(&b[..cut]).is_err());
        }
        let m = entry_member(Sid::new(7, 0), &[(b"f", b"v"), (b"", b"x")]);
        let (id, pairs) = decode_entry(&m).unwrap();
        assert_eq!(id, Sid::new(7, 0));
        assert_eq!(pairs[1], (b"".to_vec(), b"x".to_vec()));
        let p = Pending {
            id: Sid::new(3, 4),
            delivered: -5,
            count: 2,
            consumer: b"bob".to_vec(),
        };
        assert_eq!(Pending::decode(&p.member()).unwrap(), p);
    }

    #[test]
    fn ids_order_as_their_bytes_and_step() {
        let a = Sid::new(1, u64::MAX);
        let b = Sid::new(2, 0);
        assert!(a < b && a.be() < b.be());
        assert_eq!(a.next(), Some(b));
        assert_eq!(b.prev(), Some(a));
        assert_eq!(Sid::MAX.next(), None);
        assert_eq!(Sid::MIN.prev(), None);
        assert_eq!(b.to_string(), "2-0");
    }
}
