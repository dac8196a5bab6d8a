//! The direct store: one tier on the persistent heap (UDORN's "the database is the
//! image"): every operation goes to a durable index in the heap, and an update is
//! durable when it returns. The index is the log-free hash table (default) or phash
//! (Bullet's backend table), by configuration.
//!
//! Read-modify-write operations (`Incr`) must not interleave with other updates of
//! the same key, so updates take one of 1024 striped DRAM locks by key hash; gets
//! take none.

use crate::{
    check_op, incr_value, Durability, Error, KeyHasher, Op, Outcome, Result, Session, Store,
    StoreStats,
};
use index::any::{attach_any, AnyHandle, AnyIndex};
use index::{HashOptions, Index, LfHash, Ops, PHash, PHashOptions, RecoverStats};
use pmem::{Heap, Recovery};
use std::sync::{Arc, Mutex};

/// Which durable index a store keeps its keys in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The log-free hash table (link-and-persist, link cache, NV-epochs).
    LogFree,
    /// The lock-based table with redo-log transactions (Bullet's backend).
    PHash,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::LogFree => "logfree",
            BackendKind::PHash => "phash",
        }
    }

    pub fn parse(s: &str) -> Result<BackendKind> {
        match s {
            "logfree" | "hash" => Ok(BackendKind::LogFree),
            "phash" | "redo" => Ok(BackendKind::PHash),
            _ => Err(Error::Config(format!(
                "unknown backend {s:?} (logfree or phash)"
            ))),
        }
    }
}

/// How to build a backend index.
#[derive(Clone, Debug)]
pub struct BackendOptions {
    pub kind: BackendKind,
    /// Initial buckets (log-free: grows online; phash: fixed for its life).
    pub buckets: u64,
    /// The log-free table's link cache.
    pub link_cache: bool,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            kind: BackendKind::LogFree,
            buckets: 1 << 16,
            link_cache: true,
        }
    }
}

/// Creates a backend index in `heap` (not yet reachable from the root).
pub fn create_backend(heap: &Heap, o: &BackendOptions) -> Result<AnyIndex> {
    Ok(match o.kind {
        BackendKind::LogFree => AnyIndex::Hash(LfHash::create(
            heap,
            &HashOptions {
                initial_buckets: o.buckets.next_power_of_two().max(16),
                link_cache: o.link_cache,
                ..Default::default()
            },
        )?),
        BackendKind::PHash => AnyIndex::PHash(PHash::create(
            heap,
            &PHashOptions {
                buckets: o.buckets,
                ..Default::default()
            },
        )?),
    })
}

/// The kind of an attached backend (`None` for the skip list, which no store uses
/// as a key-value backend).
pub fn backend_kind(i: &AnyIndex) -> Option<BackendKind> {
    match i {
        AnyIndex::Hash(_) => Some(BackendKind::LogFree),
        AnyIndex::PHash(_) => Some(BackendKind::PHash),
        AnyIndex::Skip(_) => None,
    }
}

const STRIPES: usize = 1024;

struct Inner {
    heap: Heap,
    index: AnyIndex,
    /// The index's key hash (a random one for a skip list, which has none).
    hasher: KeyHasher,
    stripes: Box<[Mutex<()>]>,
}

/// The single-tier persistent store. Clone is cheap.
#[derive(Clone)]
pub struct DirectStore {
    inner: Arc<Inner>,
}

impl DirectStore {
    /// Creates the store's index in `heap` and makes it the heap's root.
    pub fn create(heap: &Heap, o: &BackendOptions) -> Result<DirectStore> {
        let index = create_backend(heap, o)?;
        heap.set_root(index.root())?;
        Ok(Self::from_index(heap.clone(), index))
    }

    fn from_index(heap: Heap, index: AnyIndex) -> DirectStore {
        let stripes = (0..STRIPES).map(|_| Mutex::new(())).collect();
        DirectStore {
            inner: Arc::new(Inner {
                heap,
                hasher: index.hasher().unwrap_or_else(KeyHasher::random),
                index,
                stripes,
            }),
        }
    }

    /// Opens the store of a heap being recovered: attaches the index at the root,
    /// finishes interrupted removals and sweeps leaks (index recovery), and returns
    /// the store with the recovery figures.
    pub fn open(rec: Recovery) -> Result<(DirectStore, RecoverStats)> {
        let root = rec.heap().root();
        let index = attach_any(rec.heap(), root)?;
        if backend_kind(&index).is_none() {
            return Err(Error::Corrupt(
                "the heap's root is a skip list, not a key-value store".into(),
            ));
        }
        let (heap, stats) = index::recover(rec, &[index.recoverable()])?;
        Ok((Self::from_index(heap, index), stats))
    }

    pub fn index(&self) -> &AnyIndex {
        &self.inner.index
    }

    pub fn heap(&self) -> &Heap {
        &self.inner.heap
    }
}

pub struct DirectSession {
    inner: Arc<Inner>,
    h: AnyHandle,
    buf: Vec<u8>,
}

impl Store for DirectStore {
    type Session = DirectSession;

    fn session(&self) -> Result<DirectSession> {
        Ok(DirectSession {
            inner: self.inner.clone(),
            h: self.inner.index.handle()?,
            buf: Vec::new(),
        })
    }

    fn name(&self) -> String {
        format!(
            "direct-{}",
            backend_kind(&self.inner.index).map_or("?", |k| k.name())
        )
    }

    fn durability(&self) -> Durability {
        Durability::Heap
    }

    fn key_hasher(&self) -> KeyHasher {
        self.inner.hasher
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            keys: self.inner.index.len_estimate(),
            ..Default::default()
        }
    }

    fn close(&self) -> Result<()> {
        self.inner.index.close()?;
        Ok(())
    }
}

impl Session for DirectSession {
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        Ok(self.h.get(key, out)?)
    }

    /// The index's scan (durable keys only: the index returns a key once its
    /// insertion is durable).
    fn scan(&mut self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64> {
        Ok(self.h.scan(cursor, count, out)?)
    }

    fn apply(&mut self, key: &[u8], op: Op<'_>) -> Result<Outcome> {
        check_op(key, &op)?;
        let s = (self.inner.hasher.hash(key) >> 40) as usize % STRIPES;
        let _g = self.inner.stripes[s]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let out = match op {
            Op::Put(v) => {
                // The index's put does not say what it replaced: the old value's
                // first byte is read before it (the stripe lock keeps them together).
                let old_first = if self.h.get(key, &mut self.buf)? {
                    self.buf.first().copied()
                } else {
                    None
                };
                Outcome::Put {
                    created: self.h.put(key, v)?,
                    old_first,
                }
            }
            Op::Remove => Outcome::Removed(self.h.remove(key)?),
            Op::Incr(d) => {
                let found = self.h.get(key, &mut self.buf)?;
                let n = incr_value(found.then_some(self.buf.as_slice()), d)?;
                self.h.put(key, n.to_string().as_bytes())?;
                Outcome::Int(n)
            }
        };
        // The acknowledgement waits for durability (the link cache may hold the
        // last link).
        self.h.sync()?;
        Ok(out)
    }
}
