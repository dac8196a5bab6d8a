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
use engine::types::tree::{Pieces, Tree};

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

/// Stages the removal of the pieces of the collection whose raw store value
/// is `raw` (tag, expiry, payload), if it has any; a string has none.
pub fn free_value(ks: &mut Keyspace, raw: &[u8]) -> Result<(), KsError> {
    let h = crate::keyspace::decode(raw).ok_or(KsError::Corrupt)?;
    match h.kind {
        crate::keyspace::KIND_HASH | crate::keyspace::KIND_SET => {
            let head = MapHead::decode(&raw[h.off..]).map_err(KsError::Store)?;
            free_map(ks, &head).map_err(KsError::Store)
        }
        crate::keyspace::KIND_LIST => {
            let head = ListHead::decode(&raw[h.off..]).map_err(KsError::Store)?;
            if let ListHead::Tree { id, mut meta } = head {
                let mut p = KsPieces::new(ks, id);
                let ids = Tree::new(&mut p, &mut meta, false)
                    .pieces()
                    .map_err(KsError::Store)?;
                for piece in ids {
                    p.remove(piece).map_err(KsError::Store)?;
                }
            }
            Ok(())
        }
        crate::keyspace::KIND_ZSET => {
            let head = ZsetHead::decode(&raw[h.off..]).map_err(KsError::Store)?;
            if let ZsetHead::Tree { id, .. } = head {
                let ids = crate::cmd::zset_piece_ids(ks, &head).map_err(KsError::Store)?;
                let mut p = KsPieces::new(ks, id);
                for piece in ids {
                    p.remove(piece).map_err(KsError::Store)?;
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

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
