//! Collections in the keyspace: the bridge between the engine's structures
//! (`engine::types`: a head value under the user's key, pieces under
//! internal keys) and the keyspace's staged writes. Every piece read sees the
//! running command's staged writes and every piece write is staged in its
//! batch, so a command's head and pieces are applied together (one
//! crash-atomic batch where the store makes batches so).
//!
//! Readers of a collection take its stripe lock (`cmd::locked`): a command
//! that splits a bucket writes the head and two pieces, and a reader without
//! the lock could see the new head before the new pieces.

use crate::keyspace::{Keyspace, KsError};
use engine::types::edit::Edit;
use engine::types::head::{piece_key, ListHead, MapHead, ZsetHead};
use engine::types::lhash::{Bucket, Pair, Table};
use engine::types::node::Node;
use engine::types::stream::StreamHead;
use engine::types::tree::{Meta as TreeMeta, Pieces, Tree};

/// The pieces of collection `id`, read and written through a keyspace's
/// staged batch.
pub struct KsPieces<'a> {
    pub ks: &'a mut Keyspace,
    pub id: u64,
    kbuf: Vec<u8>,
}

impl<'a> KsPieces<'a> {
    pub fn new(ks: &'a mut Keyspace, id: u64) -> Self {
        KsPieces {
            ks,
            id,
            kbuf: Vec::with_capacity(17),
        }
    }
}

fn store_err(e: KsError) -> engine::Error {
    match e {
        KsError::Store(e) => e,
        KsError::Corrupt => engine::Error::Corrupt("a collection's piece".into()),
        // Pieces are internal keys, which a unit never refuses.
        KsError::Undeclared => engine::Error::Corrupt("a piece outside its unit".into()),
        KsError::Repl(e) => engine::Error::Config(crate::cluster::error_text(&e)),
    }
}

impl Pieces for KsPieces<'_> {
    fn get(&mut self, id: u64) -> engine::Result<Option<Vec<u8>>> {
        piece_key(self.id, id, &mut self.kbuf);
        let mut out = Vec::new();
        match self.ks.get_piece(&self.kbuf, &mut out).map_err(store_err)? {
            true => Ok(Some(out)),
            false => Ok(None),
        }
    }

    fn put(&mut self, id: u64, bytes: Vec<u8>) -> engine::Result<()> {
        piece_key(self.id, id, &mut self.kbuf);
        self.ks.put_piece(&self.kbuf, &bytes);
        Ok(())
    }

    /// Applies the edit to the piece, for the command's later reads, and
    /// stages the edit itself as a merge operation (`Keyspace::edit_piece`):
    /// the log carries the edit, not the piece's new bytes.
    fn edit(&mut self, id: u64, ordered: bool, e: &Edit) -> engine::Result<()> {
        let old = self
            .get(id)?
            .ok_or_else(|| engine::Error::Corrupt(format!("piece {id} to edit is missing")))?;
        let new = e.apply(ordered, &old)?;
        let mut enc = Vec::new();
        e.encode(ordered, &mut enc);
        piece_key(self.id, id, &mut self.kbuf);
        self.ks.edit_piece(&self.kbuf, new, &enc);
        Ok(())
    }

    fn remove(&mut self, id: u64) -> engine::Result<()> {
        piece_key(self.id, id, &mut self.kbuf);
        self.ks.remove_piece(&self.kbuf);
        Ok(())
    }
}

/// Stages the removal of every piece of a hash's or set's head (the head
/// itself is the caller's: it is being deleted or overwritten).
pub fn free_map(ks: &mut Keyspace, head: &MapHead) -> engine::Result<()> {
    if let MapHead::Table { id, meta } = head {
        let mut meta = *meta;
        let mut p = KsPieces::new(ks, *id);
        let ids = Table::new(&mut p, &mut meta).pieces()?;
        for piece in ids {
            p.remove(piece)?;
        }
    }
    Ok(())
}

/// One structure of a pieced collection, under its id.
#[derive(Clone, Copy, Debug)]
pub enum Part {
    /// A counted B+-tree (a list's positions: `ordered` false; a sorted
    /// set's order: true).
    Tree(TreeMeta, bool),
    /// A linear-hashing table (a hash, a set, a sorted set's scores).
    Table(engine::types::lhash::Meta),
}

/// A pieced collection's id and structures, from its kind and head payload;
/// None when the value has no pieces (a string, an inline collection).
///
/// The one place that knows which kinds have pieces: freeing, copying and
/// MEMORY USAGE walk what this returns, so a new kind is one arm here and
/// one in [`rehead`] (its head for a new id and new structures: COPY).
pub fn parts(kind: u8, payload: &[u8]) -> Result<Option<(u64, Vec<Part>)>, KsError> {
    use crate::keyspace::{KIND_HASH, KIND_LIST, KIND_SET, KIND_STREAM, KIND_STRING, KIND_ZSET};
    match kind {
        KIND_STRING => Ok(None),
        KIND_HASH | KIND_SET => match MapHead::decode(payload)? {
            MapHead::Table { id, meta } => Ok(Some((id, vec![Part::Table(meta)]))),
            MapHead::Inline(_) => Ok(None),
        },
        KIND_LIST => match ListHead::decode(payload)? {
            ListHead::Tree { id, meta } => Ok(Some((id, vec![Part::Tree(meta, false)]))),
            ListHead::Inline(_) => Ok(None),
        },
        KIND_ZSET => match ZsetHead::decode(payload)? {
            ZsetHead::Tree { id, tree, map } => {
                Ok(Some((id, vec![Part::Tree(tree, true), Part::Table(map)])))
            }
            ZsetHead::Inline(_) => Ok(None),
        },
        KIND_STREAM => {
            let h = StreamHead::decode(payload)?;
            let mut parts = vec![Part::Tree(h.entries, true)];
            parts.extend(h.groups.iter().map(|g| Part::Tree(g.pel, true)));
            Ok(Some((h.id, parts)))
        }
        _ => Err(KsError::Store(engine::Error::Corrupt(format!(
            "a value of kind {kind}, whose pieces this version cannot walk"
        )))),
    }
}

/// A cheap bound on a collection's piece count (at most one piece read):
/// whether it is small enough to free in its command's batch.
fn piece_estimate(ks: &mut Keyspace, id: u64, parts: &[Part]) -> Result<u64, KsError> {
    let mut n = 0u64;
    for part in parts {
        n = n.saturating_add(match part {
            Part::Table(meta) => meta.buckets(),
            Part::Tree(meta, ordered) => match meta.height {
                0 | 1 => u64::from(meta.height),
                2 => match KsPieces::new(ks, id).get(meta.root)? {
                    Some(b) => match Node::decode(&b, *ordered)? {
                        Node::Inner(c) => c.len() as u64 + 1,
                        Node::Leaf(_) => 1,
                    },
                    None => 0,
                },
                _ => u64::MAX,
            },
        });
    }
    Ok(n)
}

/// The pieces of a collection still in the store, children before their
/// parents: removing them in this order keeps what is left walkable, so a
/// walk after a crash in the middle lists exactly the pieces not yet
/// removed (a missing inner node's children are gone too). Leaves and
/// table buckets are listed unread (some may be gone already: removing an
/// absent key does nothing).
pub fn pieces_left(ks: &mut Keyspace, kind: u8, payload: &[u8]) -> Result<Vec<u64>, KsError> {
    let Some((id, parts)) = parts(kind, payload)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for part in parts {
        match part {
            Part::Table(meta) => {
                out.extend((0..meta.buckets()).map(|b| engine::types::lhash::BUCKET_ID | b))
            }
            Part::Tree(meta, ordered) => {
                if meta.root == 0 {
                    continue;
                }
                let mut p = KsPieces::new(ks, id);
                let mut inner: Vec<u64> = Vec::new();
                let mut level = vec![meta.root];
                for _ in 1..meta.height {
                    let mut next = Vec::new();
                    for &pid in &level {
                        let Some(b) = p.get(pid)? else { continue };
                        match Node::decode(&b, ordered)? {
                            Node::Inner(children) => next.extend(children.iter().map(|c| c.id)),
                            Node::Leaf(_) => return Err(KsError::Corrupt),
                        }
                        inner.push(pid);
                    }
                    level = next;
                }
                out.extend_from_slice(&level);
                out.extend(inner.iter().rev());
            }
        }
    }
    Ok(out)
}

/// Stages what deleting or overwriting the collection whose raw store
/// value is `raw` (tag, expiry, payload) does to its pieces: a small one
/// (fewer than [`crate::housekeep::LAZY_MIN_PIECES`]) has them removed in
/// the same batch; a larger one gets a free-list entry holding its kind and
/// head, and the lazy free removes them later in bounded batches. A string
/// or an inline collection has none.
pub fn free_value(ks: &mut Keyspace, raw: &[u8]) -> Result<(), KsError> {
    let h = crate::keyspace::decode(raw).ok_or(KsError::Corrupt)?;
    let payload = &raw[h.off..];
    let Some((id, parts)) = parts(h.kind, payload)? else {
        return Ok(());
    };
    if piece_estimate(ks, id, &parts)? < crate::housekeep::LAZY_MIN_PIECES {
        let mut p = KsPieces::new(ks, id);
        for part in parts {
            let ids = match part {
                Part::Table(mut meta) => Table::new(&mut p, &mut meta).pieces()?,
                Part::Tree(mut meta, ordered) => Tree::new(&mut p, &mut meta, ordered).pieces()?,
            };
            for piece in ids {
                p.remove(piece)?;
            }
        }
    } else {
        let mut v = Vec::with_capacity(payload.len() + 1);
        v.push(h.kind);
        v.extend_from_slice(payload);
        ks.put_piece(&crate::housekeep::gc_key(id), &v);
    }
    Ok(())
}

/// Pieces a large COPY writes per batch.
const COPY_PIECES: usize = 256;

/// A large COPY under way: its pieces go in batches of their own, each with
/// an in-progress free-list entry for the new id saying what exists so far
/// (see [`crate::housekeep`]), so a crash or a failure in the middle leaves
/// pieces that the lazy free removes, never a leak.
struct Copying {
    new: u64,
    kind: u8,
    run: u64,
    /// Whether the copy goes in batches of its own (else all of it is in
    /// the command's batch).
    large: bool,
}

impl Copying {
    /// After piece `i` was copied (`r`: how that went), with `head`
    /// covering what is copied: a checkpoint every [`COPY_PIECES`] pieces of
    /// a large copy; on a failure, what was copied goes to the lazy free.
    fn step(
        &self,
        ks: &mut Keyspace,
        i: usize,
        r: engine::Result<()>,
        head: &[u8],
    ) -> Result<(), KsError> {
        let r = r.map_err(KsError::from).and_then(|_| {
            if self.large && (i + 1).is_multiple_of(COPY_PIECES) {
                self.checkpoint(ks, head)
            } else {
                Ok(())
            }
        });
        if r.is_err() {
            self.abandon(ks, head);
        }
        r
    }

    /// Applies what is staged with an in-progress entry covering `head`.
    fn checkpoint(&self, ks: &mut Keyspace, head: &[u8]) -> Result<(), KsError> {
        let mut v = Vec::with_capacity(head.len() + 9);
        v.push(self.kind | crate::housekeep::IN_PROGRESS);
        v.extend_from_slice(&self.run.to_le_bytes());
        v.extend_from_slice(head);
        ks.put_piece(&crate::housekeep::gc_key(self.new), &v);
        ks.apply()
    }

    /// Hands what was copied to the lazy free (the copy failed: the
    /// command's batch, applied all the same, carries this entry; if that
    /// fails too, an in-progress entry left by a checkpoint is freed at the
    /// next start).
    fn abandon(&self, ks: &mut Keyspace, head: &[u8]) {
        let mut v = Vec::with_capacity(head.len() + 1);
        v.push(self.kind);
        v.extend_from_slice(head);
        ks.put_piece(&crate::housekeep::gc_key(self.new), &v);
    }
}

/// A copy of a collection's head payload whose pieces (if any) are copied
/// under a new collection id (COPY). O(n) in the collection, as Redis's
/// COPY. A small collection's copy is staged in the running command's
/// batch; a large one's pieces are applied in batches of their own first
/// (the caller's locks held throughout), and its last pieces and the
/// in-progress entry's removal are staged for the command's batch, which
/// writes the new head: so the copy appears whole or not at all.
///
/// Generic over [`parts`]: a tree's pieces are positional, copied as they
/// are under the new id, parents before children (so that the walk of a
/// partial copy finds every piece it made); a table's hash is seeded by its
/// id, so its pairs are dealt into the buckets of a new table of the size
/// inserts would have grown (a load of at most `GROW_LOAD` per bucket).
/// Only the new head is per kind ([`rehead`]).
pub fn copy_value(
    sh: &crate::server::Shared,
    ks: &mut Keyspace,
    kind: u8,
    payload: &[u8],
) -> Result<Vec<u8>, KsError> {
    let Some((id, parts)) = parts(kind, payload)? else {
        return Ok(payload.to_vec());
    };
    mark_pieced(sh, ks);
    let cp = Copying {
        new: new_id(),
        kind,
        run: sh.hk.run,
        large: piece_estimate(ks, id, &parts)? >= crate::housekeep::LAZY_MIN_PIECES,
    };
    // The new structures (a table's new state, and its buckets dealt).
    let mut new_parts = Vec::with_capacity(parts.len());
    let mut dealt = Vec::new();
    for part in &parts {
        new_parts.push(match *part {
            Part::Tree(meta, ordered) => Part::Tree(meta, ordered),
            Part::Table(mut meta) => {
                let mut pairs = Vec::with_capacity(meta.count as usize);
                Table::new(&mut KsPieces::new(ks, id), &mut meta)
                    .for_each(|f, v| pairs.push((f.to_vec(), v.to_vec())))?;
                let (meta, buckets) = deal(cp.new, pairs);
                dealt.push(buckets);
                Part::Table(meta)
            }
        });
    }
    let head = rehead(kind, cp.new, &new_parts, payload)?;
    let mut n = 0;
    let mut dealt = dealt.into_iter();
    for part in parts {
        match part {
            Part::Tree(mut meta, ordered) => {
                let ids = Tree::new(&mut KsPieces::new(ks, id), &mut meta, ordered).pieces()?;
                for pid in ids {
                    let r = KsPieces::new(ks, id).get(pid).and_then(|b| {
                        let b = b.ok_or_else(|| {
                            engine::Error::Corrupt(format!("piece {pid} is missing"))
                        })?;
                        KsPieces::new(ks, cp.new).put(pid, b)
                    });
                    cp.step(ks, n, r, &head)?;
                    n += 1;
                }
            }
            Part::Table(_) => {
                for (b, bucket) in dealt.next().unwrap_or_default().iter().enumerate() {
                    if bucket.0.is_empty() {
                        continue;
                    }
                    let bid = engine::types::lhash::BUCKET_ID | b as u64;
                    let r = KsPieces::new(ks, cp.new).put(bid, bucket.encode());
                    cp.step(ks, n, r, &head)?;
                    n += 1;
                }
            }
        }
    }
    if cp.large {
        ks.remove_piece(&crate::housekeep::gc_key(cp.new));
    }
    Ok(head)
}

/// A new table (hash seed `seed`) holding `pairs`: its state and its
/// buckets.
fn deal(seed: u64, pairs: Vec<Pair>) -> (engine::types::lhash::Meta, Vec<Bucket>) {
    use engine::types::lhash::{Meta, GROW_LOAD};
    let count = pairs.len() as u64;
    let buckets = count.div_ceil(GROW_LOAD).max(1);
    let level = buckets.ilog2();
    let meta = Meta {
        level,
        split: buckets - (1u64 << level),
        count,
        seed,
    };
    let mut dealt = vec![Bucket::default(); buckets as usize];
    for (f, v) in pairs {
        let b = meta.bucket_of(meta.hash(&f));
        dealt[b as usize].0.push((f, v));
    }
    (meta, dealt)
}

/// The head of a collection of `kind` with id `id` and structures `parts`
/// (in the order [`parts`] lists them): one arm per kind with pieces.
fn rehead(kind: u8, id: u64, parts: &[Part], payload: &[u8]) -> Result<Vec<u8>, KsError> {
    use crate::keyspace::{KIND_HASH, KIND_LIST, KIND_SET, KIND_STREAM, KIND_ZSET};
    let mut out = Vec::new();
    match (kind, parts) {
        (KIND_STREAM, [Part::Tree(entries, _), pels @ ..]) => {
            // The same state; the trees' roots as copied, under the new id.
            let mut h = StreamHead::decode(payload)?;
            h.id = id;
            h.entries = *entries;
            for (g, p) in h.groups.iter_mut().zip(pels) {
                if let Part::Tree(m, _) = p {
                    g.pel = *m;
                }
            }
            h.encode(&mut out)
        }
        (KIND_HASH | KIND_SET, &[Part::Table(meta)]) => {
            MapHead::Table { id, meta }.encode(&mut out)
        }
        (KIND_LIST, &[Part::Tree(meta, _)]) => ListHead::Tree { id, meta }.encode(&mut out),
        (KIND_ZSET, &[Part::Tree(tree, _), Part::Table(map)]) => {
            ZsetHead::Tree { id, tree, map }.encode(&mut out)
        }
        _ => {
            return Err(KsError::Store(engine::Error::Corrupt(format!(
                "a value of kind {kind}, whose head this version cannot rewrite"
            ))))
        }
    }
    Ok(out)
}

/// MEMORY USAGE's estimate of a pieced collection's pieces: every piece's
/// bytes plus [`PIECE_OVERHEAD`], measured on `samples` pieces spread over
/// the collection (all when 0) and scaled to the piece count.
pub fn pieces_usage(
    ks: &mut Keyspace,
    kind: u8,
    payload: &[u8],
    samples: usize,
) -> Result<u64, KsError> {
    let Some((id, _)) = parts(kind, payload)? else {
        return Ok(0);
    };
    let ids = pieces_left(ks, kind, payload)?;
    if ids.is_empty() {
        return Ok(0);
    }
    let step = if samples == 0 || samples >= ids.len() {
        1
    } else {
        ids.len() / samples
    };
    let mut p = KsPieces::new(ks, id);
    let (mut seen, mut bytes) = (0u64, 0u64);
    for &pid in ids.iter().step_by(step) {
        seen += 1;
        if let Some(b) = p.get(pid)? {
            bytes += b.len() as u64 + 17 + PIECE_OVERHEAD;
        }
    }
    // Scaled to every piece listed (empty table buckets, which have no
    // piece, scale as such).
    Ok(bytes.saturating_mul(ids.len() as u64) / seen.max(1))
}

/// Store bytes per entry beyond its key and value (the index entry and the
/// value block's header, ~64 B; Bullet's frontend copy of a hot entry is not
/// counted).
pub const PIECE_OVERHEAD: u64 = 64;

/// A store entry present once any collection has had pieces: one byte, the
/// piece prefix alone (no piece key is that short, no user key starts so).
pub const PIECED_KEY: &[u8] = &[engine::types::head::PIECE_PREFIX];

/// Whether the store holds the [`PIECED_KEY`] marker.
pub fn has_pieced(store: &crate::store::AnyStore) -> engine::Result<bool> {
    let mut sess = store.session()?;
    let mut out = Vec::new();
    sess.get(PIECED_KEY, &mut out)
}

/// Called by a command about to give a collection pieces: the first time,
/// stages the [`PIECED_KEY`] marker in the same batch (so the marker is
/// durable before, or with, the first piece) and sets the flag that makes
/// blind overwrites read what they replace.
pub fn mark_pieced(sh: &crate::server::Shared, ks: &mut Keyspace) {
    use std::sync::atomic::Ordering;
    if !sh.pieced.load(Ordering::Relaxed) {
        ks.put_piece(PIECED_KEY, b"1");
        sh.pieced.store(true, Ordering::Relaxed);
    }
}

/// A new collection id: random, so that collections never share pieces and
/// a client cannot predict the hash seed (the id seeds the table's hash).
pub fn new_id() -> u64 {
    use rand::RngExt;
    rand::rng().random::<u64>()
}

/// The pairs of an inline head, or of a whole table (O(n)).
pub fn map_pairs(ks: &mut Keyspace, head: &MapHead) -> engine::Result<Vec<Pair>> {
    match head {
        MapHead::Inline(b) => Ok(b.0.clone()),
        MapHead::Table { id, meta } => {
            let mut meta = *meta;
            let mut p = KsPieces::new(ks, *id);
            let mut out = Vec::with_capacity(meta.count as usize);
            Table::new(&mut p, &mut meta).for_each(|f, v| out.push((f.to_vec(), v.to_vec())))?;
            Ok(out)
        }
    }
}

/// Converts an inline head that outgrew its limits into a table.
pub fn to_table(ks: &mut Keyspace, pairs: Bucket) -> engine::Result<MapHead> {
    let id = new_id();
    let mut meta = engine::types::lhash::Meta::new(id);
    let mut p = KsPieces::new(ks, id);
    let mut t = Table::new(&mut p, &mut meta);
    for (f, v) in &pairs.0 {
        t.set(f, v)?;
    }
    Ok(MapHead::Table { id, meta })
}
