//! A counted B+-tree whose nodes are pieces: a list (elements by position)
//! or a sorted set's order (elements by score, then member).
//!
//! Every inner entry holds its child's element count, so a position or a rank
//! is found in one descent: insert, remove, rank, element at a rank, and the
//! start of a range all cost O(height) piece reads, and an insert or a remove
//! writes one leaf edit plus one count edit per level above it (a split or an
//! emptied node rewrites the few pieces it changes). Height is
//! log_64(n / 64) + 1: 4 at 10,000,000 elements.
//!
//! **Ordered trees.** Child `i >= 1` of an inner node holds keys at or above
//! its `low`, and child `i - 1` keys below it; child 0's `low` is unused.
//! Inserts and removes keep this without touching `low`s (a removal never
//! breaks a lower bound; an insert descends into the last child whose `low`
//! is at or below the key), and a split gives the new right node the first key
//! it holds.
//!
//! **Shrinking.** An emptied node is removed from its parent, and a root with
//! one child is replaced by it. Underfull neighbours are not merged (Redis's
//! quicklist does not merge them on deletion either): a node holds at least
//! one element, so the height stays bounded by the number of nodes.

use super::edit::Edit;
use super::node::{corrupt, Child, Entry, Node};
use crate::Result;
use std::cmp::Ordering;

/// Where a tree's pieces live: a command's view of the store (its batch over
/// the store) or, in tests, a map. `edit` both changes the piece as the
/// command's later reads see it and records the edit as the write.
pub trait Pieces {
    /// A copy of the piece (never a reference into the heap).
    fn get(&mut self, id: u64) -> Result<Option<Vec<u8>>>;
    fn put(&mut self, id: u64, bytes: Vec<u8>) -> Result<()>;
    fn edit(&mut self, id: u64, ordered: bool, e: &Edit) -> Result<()>;
    fn remove(&mut self, id: u64) -> Result<()>;
}

/// A tree's root state, kept by its owner (in the collection's head value).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// Root piece (0: the tree is empty).
    pub root: u64,
    /// Levels: 1 when the root is a leaf, 0 when empty.
    pub height: u32,
    /// The next piece id to hand out (ids are never reused within a tree).
    pub next_id: u64,
    /// Elements in the tree.
    pub count: u64,
}

impl Meta {
    pub fn new() -> Meta {
        Meta {
            root: 0,
            height: 0,
            next_id: 1,
            count: 0,
        }
    }
}

/// Node size limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A leaf splits above this many elements...
    pub leaf_entries: usize,
    /// ...or above this many encoded bytes (when it holds two or more).
    pub leaf_bytes: usize,
    /// An inner node splits above this many children.
    pub fanout: usize,
}

/// The limits in use: leaves of at most 128 elements or 8 KiB (Redis's
/// quicklist node, `list-max-listpack-size -2`), 64 children per inner node
/// (a 64-child node is about 1 KiB positional).
pub const LIMITS: Limits = Limits {
    leaf_entries: 128,
    leaf_bytes: 8192,
    fanout: 64,
};

/// Elements under `children` (saturating: counts read from a corrupt piece
/// must not overflow).
fn sum_counts(children: &[Child]) -> u64 {
    children.iter().fold(0u64, |a, c| a.saturating_add(c.count))
}

/// One inner node on a descent: its id, its children and the child taken.
struct Step {
    id: u64,
    children: Vec<Child>,
    idx: usize,
}

/// Where a descent ended.
struct Located {
    path: Vec<Step>,
    leaf_id: u64,
    leaf: Vec<Entry>,
    /// Position in the leaf.
    local: usize,
    /// Elements before `local` in the whole tree.
    rank: u64,
}

impl Located {
    /// The insert position of an empty tree (no root to descend from).
    const EMPTY_TREE: Located = Located {
        path: Vec::new(),
        leaf_id: 0,
        leaf: Vec::new(),
        local: 0,
        rank: 0,
    };
}

/// A tree over pieces `P`, with its root state `meta`.
pub struct Tree<'a, P: Pieces> {
    pub p: &'a mut P,
    pub meta: &'a mut Meta,
    pub ordered: bool,
    pub lim: Limits,
    /// An ordered tree whose members begin with a unique fixed-length key
    /// (a stream entry's 16-byte ID): inner nodes keep only that prefix of
    /// each child's low member (0: the whole member). Routing is the same,
    /// since no two members share the prefix.
    pub low_prefix: usize,
}

impl<'a, P: Pieces> Tree<'a, P> {
    pub fn new(p: &'a mut P, meta: &'a mut Meta, ordered: bool) -> Self {
        Tree {
            p,
            meta,
            ordered,
            lim: LIMITS,
            low_prefix: 0,
        }
    }

    /// Keeps only the first `n` bytes of members as inner nodes' low keys
    /// (see [`Tree::low_prefix`]).
    pub fn with_low_prefix(mut self, n: usize) -> Self {
        self.low_prefix = n;
        self
    }

    /// The low key of a node whose first element is `e`.
    fn low_of(&self, e: &Entry) -> Entry {
        if self.low_prefix > 0 && e.bytes.len() > self.low_prefix {
            Entry::new(e.score, e.bytes[..self.low_prefix].to_vec())
        } else {
            e.clone()
        }
    }

    fn load(&mut self, id: u64) -> Result<Node> {
        let b = self
            .p
            .get(id)?
            .ok_or_else(|| corrupt(format!("piece {id} is missing")))?;
        Node::decode(&b, self.ordered)
    }

    fn alloc(&mut self) -> u64 {
        let id = self.meta.next_id;
        self.meta.next_id += 1;
        id
    }

    fn put(&mut self, id: u64, n: &Node) -> Result<()> {
        self.p.put(id, n.encode(self.ordered))
    }

    /// Descends to the leaf holding position `pos` (`pos == count` when
    /// `append`: the end of the last leaf).
    fn descend_pos(&mut self, mut pos: u64, append: bool) -> Result<Located> {
        let mut path = Vec::with_capacity(self.meta.height as usize);
        let mut id = self.meta.root;
        let rank = pos;
        for _ in 1..self.meta.height {
            let Node::Inner(children) = self.load(id)? else {
                return Err(corrupt(format!("piece {id}: a leaf above the leaf level")));
            };
            let last = children
                .len()
                .checked_sub(1)
                .ok_or_else(|| corrupt("empty inner piece".into()))?;
            let mut idx = last;
            for (i, c) in children.iter().enumerate() {
                if pos < c.count || (append && i == last && pos == c.count) {
                    idx = i;
                    break;
                }
                if i == last {
                    return Err(corrupt(format!("position past the end of piece {id}")));
                }
                pos -= c.count;
            }
            let next = children[idx].id;
            path.push(Step { id, children, idx });
            id = next;
        }
        let Node::Leaf(leaf) = self.load(id)? else {
            return Err(corrupt(format!(
                "piece {id}: an inner node at the leaf level"
            )));
        };
        if pos > leaf.len() as u64 || (!append && pos == leaf.len() as u64) {
            return Err(corrupt(format!("counts above piece {id} disagree with it")));
        }
        Ok(Located {
            path,
            leaf_id: id,
            leaf,
            local: pos as usize,
            rank,
        })
    }

    /// Descends an ordered tree: `route(low)` says whether the target lies at
    /// or after an inner entry's `low`; `leaf_pos` gives the position in the
    /// leaf reached.
    fn descend_by(
        &mut self,
        route: impl Fn(&Entry) -> bool,
        leaf_pos: impl Fn(&[Entry]) -> usize,
    ) -> Result<Located> {
        let mut path = Vec::with_capacity(self.meta.height as usize);
        let mut id = self.meta.root;
        let mut rank = 0;
        for _ in 1..self.meta.height {
            let Node::Inner(children) = self.load(id)? else {
                return Err(corrupt(format!("piece {id}: a leaf above the leaf level")));
            };
            if children.is_empty() {
                return Err(corrupt("empty inner piece".into()));
            }
            let idx = (1..children.len())
                .rev()
                .find(|&i| route(&children[i].low))
                .unwrap_or(0);
            rank = children[..idx]
                .iter()
                .fold(rank, |a: u64, c| a.saturating_add(c.count));
            let next = children[idx].id;
            path.push(Step { id, children, idx });
            id = next;
        }
        let Node::Leaf(leaf) = self.load(id)? else {
            return Err(corrupt(format!(
                "piece {id}: an inner node at the leaf level"
            )));
        };
        let local = leaf_pos(&leaf);
        Ok(Located {
            path,
            leaf_id: id,
            leaf,
            local,
            rank: rank + local as u64,
        })
    }

    fn locate_key(&mut self, score: f64, member: &[u8]) -> Result<Located> {
        self.descend_by(
            |low| low.cmp_key(score, member) != Ordering::Greater,
            |leaf| leaf.partition_point(|e| e.cmp_key(score, member) == Ordering::Less),
        )
    }

    fn leaf_too_big(&self, leaf: &[Entry]) -> bool {
        leaf.len() > self.lim.leaf_entries
            || (leaf.len() > 1
                && leaf
                    .iter()
                    .map(|e| e.encoded_len(self.ordered))
                    .sum::<usize>()
                    > self.lim.leaf_bytes)
    }

    /// Inserts `entry` at the located position.
    fn insert_located(&mut self, at: Located, entry: Entry) -> Result<()> {
        let Located {
            path,
            leaf_id,
            mut leaf,
            local,
            ..
        } = at;
        self.meta.count += 1;
        if self.meta.root == 0 {
            let id = self.alloc();
            self.put(id, &Node::Leaf(vec![entry]))?;
            self.meta.root = id;
            self.meta.height = 1;
            return Ok(());
        }
        leaf.insert(local, entry.clone());
        // `carry`: the left part's count and the new right sibling to add
        // after the child just taken, while splits propagate upwards.
        let mut carry = None;
        if self.leaf_too_big(&leaf) {
            let mid = self.leaf_split_point(&leaf);
            let right = leaf.split_off(mid);
            let rid = self.alloc();
            self.put(leaf_id, &Node::Leaf(leaf.clone()))?;
            let low = self.low_of(&right[0]);
            let rc = right.len() as u64;
            self.put(rid, &Node::Leaf(right))?;
            carry = Some((
                leaf.len() as u64,
                Child {
                    id: rid,
                    count: rc,
                    low,
                },
            ));
        } else {
            let e = Edit::LeafInsert {
                pos: local as u32,
                entry,
            };
            self.p.edit(leaf_id, self.ordered, &e)?;
        }
        for step in path.into_iter().rev() {
            let Step {
                id,
                mut children,
                idx,
            } = step;
            match carry.take() {
                None => {
                    let e = Edit::ChildAdd {
                        idx: idx as u32,
                        delta: 1,
                    };
                    self.p.edit(id, self.ordered, &e)?;
                }
                Some((left_count, new)) => {
                    children[idx].count = left_count;
                    children.insert(idx + 1, new);
                    if children.len() > self.lim.fanout {
                        let right = children.split_off(children.len() / 2);
                        let rid = self.alloc();
                        self.put(id, &Node::Inner(children.clone()))?;
                        let new = Child {
                            id: rid,
                            count: sum_counts(&right),
                            low: right[0].low.clone(),
                        };
                        self.put(rid, &Node::Inner(right))?;
                        carry = Some((sum_counts(&children), new));
                    } else {
                        self.put(id, &Node::Inner(children))?;
                    }
                }
            }
        }
        if let Some((left_count, new)) = carry {
            let old = self.meta.root;
            let root = self.alloc();
            let first = Child {
                id: old,
                count: left_count,
                low: Entry::new(0.0, Vec::new()),
            };
            self.put(root, &Node::Inner(vec![first, new]))?;
            self.meta.root = root;
            self.meta.height += 1;
        }
        Ok(())
    }

    /// Where to cut an overfull leaf: at half its bytes, keeping one element
    /// on each side.
    fn leaf_split_point(&self, leaf: &[Entry]) -> usize {
        let total: usize = leaf.iter().map(|e| e.encoded_len(self.ordered)).sum();
        let mut acc = 0;
        for (i, e) in leaf.iter().enumerate() {
            acc += e.encoded_len(self.ordered);
            if acc * 2 >= total {
                return (i + 1).clamp(1, leaf.len() - 1);
            }
        }
        leaf.len() / 2
    }

    /// Removes the element at the located position (which must exist).
    fn remove_located(&mut self, at: Located) -> Result<Entry> {
        let Located {
            path,
            leaf_id,
            mut leaf,
            local,
            ..
        } = at;
        if local >= leaf.len() {
            return Err(corrupt(format!("no element at {local} in piece {leaf_id}")));
        }
        let removed = leaf.remove(local);
        self.meta.count = self
            .meta
            .count
            .checked_sub(1)
            .ok_or_else(|| corrupt("element count below zero".into()))?;
        // `gone`: the child just taken was removed whole.
        let mut gone = leaf.is_empty();
        if gone {
            self.p.remove(leaf_id)?;
        } else {
            let e = Edit::LeafRemove { pos: local as u32 };
            self.p.edit(leaf_id, self.ordered, &e)?;
        }
        for step in path.into_iter().rev() {
            let Step {
                id,
                mut children,
                idx,
            } = step;
            if gone {
                children.remove(idx);
                if children.is_empty() {
                    self.p.remove(id)?;
                    continue;
                }
                gone = false;
                self.put(id, &Node::Inner(children))?;
            } else {
                let e = Edit::ChildAdd {
                    idx: idx as u32,
                    delta: -1,
                };
                self.p.edit(id, self.ordered, &e)?;
            }
        }
        if gone {
            // The root itself was emptied.
            self.meta.root = 0;
            self.meta.height = 0;
        }
        // A root with one child gives way to it.
        while self.meta.height > 1 {
            let Node::Inner(children) = self.load(self.meta.root)? else {
                return Err(corrupt("a leaf above the leaf level".into()));
            };
            if children.len() != 1 {
                break;
            }
            self.p.remove(self.meta.root)?;
            self.meta.root = children[0].id;
            self.meta.height -= 1;
        }
        Ok(removed)
    }

    // ---- positional trees (lists) ----

    /// Inserts `bytes` before position `pos` (`pos == count` appends).
    pub fn insert_at(&mut self, pos: u64, bytes: Vec<u8>) -> Result<()> {
        debug_assert!(!self.ordered);
        if pos > self.meta.count {
            return Err(corrupt(format!("insert at {pos} past {}", self.meta.count)));
        }
        let at = if self.meta.root == 0 {
            Located::EMPTY_TREE
        } else {
            self.descend_pos(pos, true)?
        };
        self.insert_located(at, Entry::new(0.0, bytes))
    }

    /// Removes and returns the element at `pos` (< count).
    pub fn remove_at(&mut self, pos: u64) -> Result<Vec<u8>> {
        if pos >= self.meta.count {
            return Err(corrupt(format!("remove at {pos} past {}", self.meta.count)));
        }
        let at = self.descend_pos(pos, false)?;
        Ok(self.remove_located(at)?.bytes)
    }

    /// The element at `pos` (< count).
    pub fn get_at(&mut self, pos: u64) -> Result<Entry> {
        if pos >= self.meta.count {
            return Err(corrupt(format!("get at {pos} past {}", self.meta.count)));
        }
        let at = self.descend_pos(pos, false)?;
        Ok(at.leaf[at.local].clone())
    }

    /// Replaces the element at `pos` (< count) of a positional tree.
    pub fn set_at(&mut self, pos: u64, bytes: Vec<u8>) -> Result<()> {
        if pos >= self.meta.count {
            return Err(corrupt(format!("set at {pos} past {}", self.meta.count)));
        }
        let at = self.descend_pos(pos, false)?;
        let e = Edit::LeafSet {
            pos: at.local as u32,
            entry: Entry::new(0.0, bytes),
        };
        self.p.edit(at.leaf_id, self.ordered, &e)
    }

    /// Calls `f` with the elements at positions `start..=end` in order
    /// (`reverse`: from `end` down to `start`), stopping early when `f`
    /// returns false. Costs one descent per leaf visited.
    pub fn for_range(
        &mut self,
        start: u64,
        end: u64,
        reverse: bool,
        mut f: impl FnMut(&Entry) -> bool,
    ) -> Result<()> {
        if start > end || end >= self.meta.count {
            return Ok(());
        }
        if !reverse {
            let mut pos = start;
            while pos <= end {
                let at = self.descend_pos(pos, false)?;
                for e in &at.leaf[at.local..] {
                    if !f(e) {
                        return Ok(());
                    }
                    pos += 1;
                    if pos > end {
                        break;
                    }
                }
            }
        } else {
            let mut pos = end;
            loop {
                let at = self.descend_pos(pos, false)?;
                for e in at.leaf[..=at.local].iter().rev() {
                    if !f(e) {
                        return Ok(());
                    }
                    if pos == start {
                        return Ok(());
                    }
                    pos -= 1;
                }
            }
        }
        Ok(())
    }

    // ---- ordered trees (sorted sets) ----

    /// Inserts (score, member); the caller has made sure the member is not
    /// in the tree. Returns its rank.
    pub fn insert_key(&mut self, score: f64, member: &[u8]) -> Result<u64> {
        debug_assert!(self.ordered);
        let at = if self.meta.root == 0 {
            Located::EMPTY_TREE
        } else {
            self.locate_key(score, member)?
        };
        let rank = at.rank;
        self.insert_located(at, Entry::new(score, member.to_vec()))?;
        Ok(rank)
    }

    /// Removes (score, member); false when it is not in the tree.
    pub fn remove_key(&mut self, score: f64, member: &[u8]) -> Result<bool> {
        if self.meta.root == 0 {
            return Ok(false);
        }
        let at = self.locate_key(score, member)?;
        if at
            .leaf
            .get(at.local)
            .is_none_or(|e| e.cmp_key(score, member) != Ordering::Equal)
        {
            return Ok(false);
        }
        self.remove_located(at)?;
        Ok(true)
    }

    /// The rank of (score, member), if present.
    pub fn rank_of(&mut self, score: f64, member: &[u8]) -> Result<Option<u64>> {
        if self.meta.root == 0 {
            return Ok(None);
        }
        let at = self.locate_key(score, member)?;
        Ok(at
            .leaf
            .get(at.local)
            .filter(|e| e.cmp_key(score, member) == Ordering::Equal)
            .map(|_| at.rank))
    }

    /// How many elements satisfy `before`, a predicate true for a prefix of
    /// the order and false after it (e.g. "score < min"): the rank where the
    /// rest begins.
    pub fn count_before(&mut self, before: impl Fn(&Entry) -> bool) -> Result<u64> {
        if self.meta.root == 0 {
            return Ok(0);
        }
        let at = self.descend_by(&before, |leaf| leaf.partition_point(&before))?;
        Ok(at.rank)
    }

    /// Removes the element at rank `pos` of an ordered tree (ZPOPMIN/MAX,
    /// ZREMRANGEBYRANK).
    pub fn remove_rank(&mut self, pos: u64) -> Result<Entry> {
        if pos >= self.meta.count {
            return Err(corrupt(format!("remove at {pos} past {}", self.meta.count)));
        }
        let at = self.descend_pos(pos, false)?;
        self.remove_located(at)
    }

    /// Fills an empty tree with `entries` (in the tree's order; for an
    /// ordered tree sorted by (score, member) with distinct members) in one
    /// pass: leaves packed to three quarters of their limits, then each
    /// level of inner nodes above them, every piece written once. O(n), where
    /// inserting one by one would rewrite each leaf once per element.
    pub fn bulk_load(&mut self, entries: Vec<Entry>) -> Result<()> {
        if self.meta.root != 0 {
            return Err(corrupt("bulk load into a non-empty tree".into()));
        }
        if entries.is_empty() {
            return Ok(());
        }
        let (max_n, max_bytes) = (self.lim.leaf_entries * 3 / 4, self.lim.leaf_bytes * 3 / 4);
        let count = entries.len() as u64;
        let mut level: Vec<Child> = Vec::new();
        let mut leaf: Vec<Entry> = Vec::new();
        let mut bytes = 0;
        let mut it = entries.into_iter().peekable();
        while let Some(e) = it.next() {
            bytes += e.encoded_len(self.ordered);
            leaf.push(e);
            let full = it.peek().is_none_or(|next| {
                leaf.len() >= max_n || bytes + next.encoded_len(self.ordered) > max_bytes
            });
            if full {
                let id = self.alloc();
                let low = self.low_of(&leaf[0]);
                let node = Node::Leaf(std::mem::take(&mut leaf));
                level.push(Child {
                    id,
                    count: node.count(),
                    low,
                });
                self.put(id, &node)?;
                bytes = 0;
            }
        }
        let mut height = 1;
        let per_inner = (self.lim.fanout * 3 / 4).max(2);
        while level.len() > 1 {
            let mut up = Vec::with_capacity(level.len() / per_inner + 1);
            for chunk in level.chunks(per_inner) {
                let id = self.alloc();
                let node = Node::Inner(chunk.to_vec());
                up.push(Child {
                    id,
                    count: node.count(),
                    low: chunk[0].low.clone(),
                });
                self.put(id, &node)?;
            }
            level = up;
            height += 1;
        }
        self.meta.root = level[0].id;
        self.meta.height = height;
        self.meta.count = count;
        Ok(())
    }

    /// Every piece id of the tree (to free it), root first.
    pub fn pieces(&mut self) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        if self.meta.root == 0 {
            return Ok(out);
        }
        let mut level = vec![self.meta.root];
        for _ in 1..self.meta.height {
            let mut next = Vec::new();
            for &id in &level {
                let Node::Inner(children) = self.load(id)? else {
                    return Err(corrupt(format!("piece {id}: a leaf above the leaf level")));
                };
                next.extend(children.iter().map(|c| c.id));
            }
            out.extend_from_slice(&level);
            level = next;
        }
        out.extend_from_slice(&level);
        Ok(out)
    }
}

#[cfg(test)]
mod tests;

/// The pieces of a tree or table in a map, for tests: every edit goes
/// through its encoding and is applied as a store applies a merge record.
#[cfg(test)]
pub(crate) mod mem;
