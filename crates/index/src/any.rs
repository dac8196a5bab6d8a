//! Any of the index structures, found from its descriptor alone (`ember check`,
//! `ember bench recovery`, the server at start-up).
//!
//! [`attach_any`] tries each structure's `attach` in turn; each one validates its
//! own descriptor (tag, version, geometry) and refuses anything else, so the first
//! that accepts is the structure at `root`. Nothing here reads beyond what the
//! structures' own `attach` reads: a corrupt or foreign root is an error value,
//! never a panic.

use crate::hash::HashHandle;
use crate::phash::PHashHandle;
use crate::skiplist::SkipHandle;
use crate::{
    Error, HashOptions, Index, LfHash, Ops, PHash, Recoverable, Result, SkipList, SkipOptions,
    Verified,
};
use pmem::{Heap, PPtr};

/// The descriptor tags of the structures (`u32` at offset 0 of each descriptor),
/// with the structure's name: used to tell a damaged descriptor of a known
/// structure from a root that is no index structure at all.
pub const DESCRIPTOR_TAGS: [(u32, &str); 3] = [
    (0x5452_4845, "hash"), // "EHRT" (crate::hash)
    (crate::skiplist::DESC_TAG, "skiplist"),
    (crate::phash::DESC_TAG, "phash"),
];

/// One of the index structures.
#[derive(Clone)]
pub enum AnyIndex {
    Hash(LfHash),
    Skip(SkipList),
    PHash(PHash),
}

/// A per-thread handle on an [`AnyIndex`].
pub enum AnyHandle {
    Hash(HashHandle),
    Skip(SkipHandle),
    PHash(PHashHandle),
}

/// Attaches to the structure whose descriptor is at `root`, whichever it is. The
/// log-free hash table is attached with the default options (link cache on).
///
/// When no structure accepts `root`, the error is the one of the structure whose
/// descriptor tag `root` carries (a damaged descriptor), or else
/// [`Error::Corrupt`] saying that `root` is not a known index structure.
pub fn attach_any(heap: &Heap, root: PPtr<u8>) -> Result<AnyIndex> {
    let hash = LfHash::attach(heap, root, &HashOptions::default());
    let hash_err = match hash {
        Ok(t) => return Ok(AnyIndex::Hash(t)),
        Err(e) => e,
    };
    let skip_err = match SkipList::attach(heap, root, &SkipOptions::default()) {
        Ok(t) => return Ok(AnyIndex::Skip(t)),
        Err(e) => e,
    };
    let phash_err = match PHash::attach(heap, root) {
        Ok(t) => return Ok(AnyIndex::PHash(t)),
        Err(e) => e,
    };
    Err(match claimed_by(heap, root) {
        Some("hash") => hash_err,
        Some("skiplist") => skip_err,
        Some(_) => phash_err,
        None => Error::Corrupt(format!(
            "root {:#x} is not a known index structure",
            root.raw()
        )),
    })
}

/// The name of the structure whose descriptor tag the block at `root` carries
/// (whether or not the rest of the descriptor is valid); `None` when `root` is
/// null, outside the heap, or carries no known tag.
pub fn claimed_by(heap: &Heap, root: PPtr<u8>) -> Option<&'static str> {
    let r = heap.region();
    let off = root.raw();
    if off == 0 || !r.contains(off, 4) {
        return None;
    }
    let tag: u32 = r.read(off);
    DESCRIPTOR_TAGS
        .iter()
        .find(|(t, _)| *t == tag)
        .map(|(_, n)| *n)
}

impl AnyIndex {
    /// `"hash"`, `"skiplist"` or `"phash"`.
    pub fn name(&self) -> &'static str {
        match self {
            AnyIndex::Hash(_) => "hash",
            AnyIndex::Skip(_) => "skiplist",
            AnyIndex::PHash(_) => "phash",
        }
    }

    /// How the structure hashes its keys; `None` for the skip list, which is
    /// ordered by key bytes.
    pub fn hasher(&self) -> Option<crate::KeyHasher> {
        match self {
            AnyIndex::Hash(t) => Some(t.hasher()),
            AnyIndex::Skip(_) => None,
            AnyIndex::PHash(t) => Some(t.hasher()),
        }
    }

    /// As a [`Recoverable`], for [`crate::recover`].
    pub fn recoverable(&self) -> &dyn Recoverable {
        match self {
            AnyIndex::Hash(t) => t,
            AnyIndex::Skip(t) => t,
            AnyIndex::PHash(t) => t,
        }
    }
}

impl From<LfHash> for AnyIndex {
    fn from(t: LfHash) -> Self {
        AnyIndex::Hash(t)
    }
}

impl From<SkipList> for AnyIndex {
    fn from(t: SkipList) -> Self {
        AnyIndex::Skip(t)
    }
}

impl From<PHash> for AnyIndex {
    fn from(t: PHash) -> Self {
        AnyIndex::PHash(t)
    }
}

impl Recoverable for AnyIndex {
    fn repair(&self, slots: &[(PPtr<u8>, u64)]) -> Result<u64> {
        self.recoverable().repair(slots)
    }

    fn reachable(&self, p: PPtr<u8>) -> bool {
        self.recoverable().reachable(p)
    }
}

impl Index for AnyIndex {
    type Handle = AnyHandle;

    fn handle(&self) -> Result<AnyHandle> {
        Ok(match self {
            AnyIndex::Hash(t) => AnyHandle::Hash(t.handle()?),
            AnyIndex::Skip(t) => AnyHandle::Skip(t.handle()?),
            AnyIndex::PHash(t) => AnyHandle::PHash(t.handle()?),
        })
    }

    fn root(&self) -> PPtr<u8> {
        match self {
            AnyIndex::Hash(t) => t.root(),
            AnyIndex::Skip(t) => t.root(),
            AnyIndex::PHash(t) => t.root(),
        }
    }

    fn verify(&self, quiescent: bool) -> std::result::Result<Verified, String> {
        match self {
            AnyIndex::Hash(t) => t.verify(quiescent),
            AnyIndex::Skip(t) => t.verify(quiescent),
            AnyIndex::PHash(t) => t.verify(quiescent),
        }
    }

    fn len_estimate(&self) -> u64 {
        match self {
            AnyIndex::Hash(t) => t.len_estimate(),
            AnyIndex::Skip(t) => t.len_estimate(),
            AnyIndex::PHash(t) => t.len_estimate(),
        }
    }

    fn close(&self) -> Result<()> {
        match self {
            AnyIndex::Hash(t) => t.close(),
            AnyIndex::Skip(t) => t.close(),
            AnyIndex::PHash(t) => t.close(),
        }
    }
}

impl Ops for AnyHandle {
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        match self {
            AnyHandle::Hash(h) => h.get(key, out),
            AnyHandle::Skip(h) => h.get(key, out),
            AnyHandle::PHash(h) => h.get(key, out),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        match self {
            AnyHandle::Hash(h) => h.put(key, value),
            AnyHandle::Skip(h) => h.put(key, value),
            AnyHandle::PHash(h) => h.put(key, value),
        }
    }

    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        match self {
            AnyHandle::Hash(h) => h.insert(key, value),
            AnyHandle::Skip(h) => h.insert(key, value),
            AnyHandle::PHash(h) => h.insert(key, value),
        }
    }

    fn remove(&mut self, key: &[u8]) -> Result<bool> {
        match self {
            AnyHandle::Hash(h) => h.remove(key),
            AnyHandle::Skip(h) => h.remove(key),
            AnyHandle::PHash(h) => h.remove(key),
        }
    }

    fn sync(&mut self) -> Result<()> {
        match self {
            AnyHandle::Hash(h) => h.sync(),
            AnyHandle::Skip(h) => h.sync(),
            AnyHandle::PHash(h) => h.sync(),
        }
    }

    fn scan(&mut self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64> {
        match self {
            AnyHandle::Hash(h) => h.scan(cursor, count, out),
            AnyHandle::Skip(h) => h.scan(cursor, count, out),
            AnyHandle::PHash(h) => h.scan(cursor, count, out),
        }
    }

    fn apply_batch(&mut self, items: &[(&[u8], Option<&[u8]>)]) -> Result<()> {
        match self {
            AnyHandle::Hash(h) => h.apply_batch(items),
            AnyHandle::Skip(h) => h.apply_batch(items),
            AnyHandle::PHash(h) => h.apply_batch(items),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmem::HeapOptions;

    fn heap(dir: &std::path::Path) -> Heap {
        let opts = HeapOptions {
            size: 64 << 20,
            ..Default::default()
        };
        Heap::create(&dir.join("h"), &opts).unwrap()
    }

    #[test]
    fn attaches_each_structure_by_its_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let heap = heap(dir.path());
        let h = LfHash::create(&heap, &HashOptions::default()).unwrap();
        let s = SkipList::create(&heap, &SkipOptions::default()).unwrap();
        let p = PHash::create(&heap, &crate::PHashOptions::default()).unwrap();
        for (root, name) in [
            (h.root(), "hash"),
            (s.root(), "skiplist"),
            (p.root(), "phash"),
        ] {
            let a = attach_any(&heap, root).unwrap();
            assert_eq!(a.name(), name);
            assert_eq!(a.root(), root);
            assert_eq!(claimed_by(&heap, root), Some(name));
            let mut hd = a.handle().unwrap();
            assert!(hd.insert(b"k", b"v").unwrap());
            let mut out = Vec::new();
            assert!(hd.get(b"k", &mut out).unwrap());
            assert_eq!(out, b"v");
            hd.sync().unwrap();
            drop(hd);
            assert_eq!(a.verify(true).unwrap().keys, 1);
        }
    }

    #[test]
    fn refuses_what_is_no_structure() {
        let dir = tempfile::tempdir().unwrap();
        let heap = heap(dir.path());
        let mut th = heap.thread().unwrap();
        let b = th.alloc_zeroed(512).unwrap();
        th.end_op();
        drop(th);
        for root in [PPtr::from_raw(0), b, PPtr::from_raw(u64::MAX - 7)] {
            let e = attach_any(&heap, root).err().expect("refused");
            assert!(e.to_string().contains("not a known index structure"), "{e}");
            assert_eq!(claimed_by(&heap, root), None);
        }
        // A damaged descriptor of a known structure: that structure's own error.
        let h = LfHash::create(&heap, &HashOptions::default()).unwrap();
        heap.region().write::<u32>(h.root().raw() + 4, &99);
        let e = attach_any(&heap, h.root()).err().expect("refused");
        assert!(e.to_string().contains("hash table"), "{e}");
        assert_eq!(claimed_by(&heap, h.root()), Some("hash"));
    }
}
