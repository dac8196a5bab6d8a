//! The direct store: one tier on the persistent heap (UDORN's "the database is the
//! image"): every operation goes to a durable index in the heap, and an update is
//! durable when it returns. The index is the log-free hash table (default) or phash
//! (Bullet's backend table), by configuration.
//!
//! Read-modify-write operations (`Incr`, `Merge`) must not interleave with other updates of
//! the same key, so updates take one of 1024 striped DRAM locks by key hash; gets
//! take none.
//!
//! ## Batches: a redo intent in the index
//! A batch of several operations ([`Session::apply_batch`]) is all-or-nothing
//! across a crash. Under the stripe locks of all its keys (taken in stripe
//! order, so batches never deadlock), the session computes each key's final
//! state (an `Incr` or a `Merge` becomes the `Put` of its result, so that
//! redoing the batch never applies an increment or an edit twice; an error fails the batch
//! before anything is written), then:
//! 1. puts the batch's physical operations (a [`WriteBatch`] of `Put`/`Remove`,
//!    its encoding) as the value of the session's **intent key** and syncs
//!    (the index's put is failure-atomic: the intent is whole or absent);
//! 2. applies them to the index and syncs;
//! 3. removes the intent key and syncs.
//!
//! Opening the store re-applies every intent it finds (idempotent: puts and
//! removes of final values), syncs, and removes it. The intent keys are
//! [`INTENT_PREFIX`] followed by a 2-byte slot number below the heap's slot
//! count (a session holds a heap slot, so there are never more sessions), so
//! opening reads at most that many keys, not the index. They are not user keys:
//! gets and scans do not show them and writes to them are refused
//! ([`Error::ReservedKey`]). The intent lives in the index rather than in an
//! area of its own because the heap's root is the index itself (servers and
//! tools identify a direct store by it), and because an index value has no
//! size limit short of the value limit: a batch of any size up to it logs one
//! intent. A batch whose operations leave one key changed needs no intent.

use crate::{
    check_op, incr_value, merge_value, Durability, Error, KeyHasher, Op, Outcome, Result, Session,
    Store, StoreStats, WriteBatch,
};
use index::any::{attach_any, AnyHandle, AnyIndex};
use index::{HashOptions, Index, LfHash, Ops, PHash, PHashOptions, RecoverStats};
use pmem::{Heap, Recovery};
use std::sync::{Arc, Mutex, MutexGuard};

/// The first bytes of the direct store's intent keys (see "Batches").
pub const INTENT_PREFIX: &[u8] = b"\xffember\x00batch-intent\x00";

/// The intent key of slot `slot`.
fn intent_key(slot: u16) -> Vec<u8> {
    let mut k = INTENT_PREFIX.to_vec();
    k.extend_from_slice(&slot.to_le_bytes());
    k
}

/// Whether `key` is one of the store's intent keys.
#[inline]
fn is_intent_key(key: &[u8]) -> bool {
    key.len() == INTENT_PREFIX.len() + 2 && key.starts_with(INTENT_PREFIX)
}

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
    /// Intent slots in use by sessions (see "Batches").
    intents: Mutex<Vec<bool>>,
}

/// Applies the first `limit` operations (`Put` or `Remove`) of `b` to the
/// index and syncs; on an error, how many were applied, and the error.
fn apply_ops(h: &mut AnyHandle, b: &WriteBatch, limit: usize) -> Result<(), (usize, Error)> {
    for (done, (key, op)) in b.iter().take(limit).enumerate() {
        let r = match op {
            Op::Put(v) => h.put(key, v).map(drop),
            _ => h.remove(key).map(drop),
        };
        r.map_err(|e| (done, e.into()))?;
    }
    h.sync().map_err(|e| (limit.min(b.len()), e.into()))
}

impl Inner {
    /// The stripe lock of `key`.
    #[inline]
    fn stripe(&self, key: &[u8]) -> usize {
        (self.hasher.hash(key) >> 40) as usize % STRIPES
    }
}

impl DirectSession {
    /// This session's intent slot (claimed once, given back when it drops).
    fn intent_slot(&mut self) -> Result<u16> {
        if let Some(s) = self.intent {
            return Ok(s);
        }
        let mut v = self.inner.intents.lock().unwrap_or_else(|e| e.into_inner());
        let s = v
            .iter()
            .position(|used| !used)
            .ok_or_else(|| Error::Config("more sessions than the heap has slots".into()))?;
        v[s] = true;
        self.intent = Some(s as u16);
        Ok(s as u16)
    }
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
        let slots = heap.region().geometry().nslots as usize;
        DirectStore {
            inner: Arc::new(Inner {
                intents: Mutex::new(vec![false; slots.min(u16::MAX as usize)]),
                heap,
                hasher: index.hasher().unwrap_or_else(KeyHasher::random),
                index,
                stripes,
            }),
        }
    }

    /// Opens the store of a heap being recovered: attaches the index at the root,
    /// finishes interrupted removals and sweeps leaks (index recovery), redoes the
    /// batches a crash interrupted, and returns the store with the recovery
    /// figures. On a heap opened for checking ([`pmem::Heap::open_check`]) all of
    /// this lands in the private mapping only, so a check reads the store as the
    /// server would find it (every batch whole or absent).
    pub fn open(rec: Recovery) -> Result<(DirectStore, RecoverStats)> {
        let root = rec.heap().root();
        let index = attach_any(rec.heap(), root)?;
        if backend_kind(&index).is_none() {
            return Err(Error::Corrupt(
                "the heap's root is a skip list, not a key-value store".into(),
            ));
        }
        let (heap, stats) = index::recover(rec, &[index.recoverable()])?;
        let st = Self::from_index(heap, index);
        st.redo_intents()?;
        Ok((st, stats))
    }

    /// Opening: re-applies the batches whose intents a crash left (each
    /// whole: its operations are final values, so applying one again is
    /// harmless; a sync each), then removes the intents (one sync).
    fn redo_intents(&self) -> Result<()> {
        let n = self
            .inner
            .intents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        let mut h = self.inner.index.handle()?;
        let mut buf = Vec::new();
        let mut found = Vec::new();
        for slot in 0..n as u16 {
            let k = intent_key(slot);
            if h.get(&k, &mut buf)? {
                let b = WriteBatch::from_bytes(&buf)?;
                if b.iter().any(|(_, op)| !op.idempotent()) {
                    return Err(Error::Corrupt(
                        "an increment or a merge in a batch intent".into(),
                    ));
                }
                apply_ops(&mut h, &b, usize::MAX).map_err(|(_, e)| e)?;
                found.push(k);
            }
        }
        if found.is_empty() {
            return Ok(());
        }
        for k in found {
            h.remove(&k)?;
        }
        h.sync()?;
        Ok(())
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
    /// This session's intent slot, claimed at its first batch.
    intent: Option<u16>,
}

impl Drop for DirectSession {
    fn drop(&mut self) {
        if let Some(s) = self.intent {
            self.inner.intents.lock().unwrap_or_else(|e| e.into_inner())[s as usize] = false;
        }
    }
}

impl Store for DirectStore {
    type Session = DirectSession;

    fn session(&self) -> Result<DirectSession> {
        Ok(DirectSession {
            inner: self.inner.clone(),
            h: self.inner.index.handle()?,
            buf: Vec::new(),
            intent: None,
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
    fn batch_limit(&self) -> Option<u64> {
        // A batch of several writes is one intent value (its redo record).
        Some((index::MAX_VALUE - crate::value::STAMP_LEN) as u64)
    }

    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        if is_intent_key(key) {
            out.clear();
            return Ok(false);
        }
        Ok(self.h.get(key, out)?)
    }

    /// The index's scan (durable keys only: the index returns a key once its
    /// insertion is durable), without the intent keys.
    fn scan(&mut self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64> {
        let from = out.len();
        let next = self.h.scan(cursor, count, out)?;
        let mut i = from;
        while i < out.len() {
            if is_intent_key(&out[i]) {
                out.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(next)
    }

    /// All-or-nothing across a crash (see "Batches"); a batch of one
    /// operation is `apply`.
    fn apply_batch(&mut self, batch: &WriteBatch, out: &mut Vec<Outcome>) -> Result<()> {
        if batch.len() <= 1 {
            return crate::apply_each(self, batch, out);
        }
        for (key, op) in batch.iter() {
            check_op(key, &op)?;
            if is_intent_key(key) {
                return Err(Error::ReservedKey);
            }
        }
        let inner = self.inner.clone();
        let mut stripes: Vec<usize> = batch.iter().map(|(k, _)| inner.stripe(k)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        // In stripe order: two batches never wait for each other in a cycle.
        let _g: Vec<MutexGuard<'_, ()>> = stripes
            .iter()
            .map(|&s| inner.stripes[s].lock().unwrap_or_else(|e| e.into_inner()))
            .collect();
        // Each key's state before the batch and as the batch goes (None:
        // absent) and whether the batch changed it, first read from the
        // index, in the order the keys are first touched.
        type KeyState<'k> = (&'k [u8], Option<Vec<u8>>, Option<Vec<u8>>, bool);
        let mut state: Vec<KeyState<'_>> = Vec::new();
        let mut outcomes = Vec::with_capacity(batch.len());
        for (key, op) in batch.iter() {
            let i = match state.iter().position(|(k, ..)| *k == key) {
                Some(i) => i,
                None => {
                    let v = self.h.get(key, &mut self.buf)?.then(|| self.buf.clone());
                    state.push((key, v.clone(), v, false));
                    state.len() - 1
                }
            };
            let (_, _, cur, changed) = &mut state[i];
            outcomes.push(match op {
                Op::Put(v) => {
                    let o = Outcome::Put {
                        created: cur.is_none(),
                        old_first: cur.as_ref().and_then(|c| c.first().copied()),
                    };
                    *cur = Some(v.to_vec());
                    *changed = true;
                    o
                }
                Op::Remove => {
                    let found = cur.is_some();
                    if found {
                        *cur = None;
                        *changed = true;
                    }
                    Outcome::Removed(found)
                }
                Op::Incr(d) => {
                    let n = incr_value(cur.as_deref(), d)?;
                    *cur = Some(n.to_string().into_bytes());
                    *changed = true;
                    Outcome::Int(n)
                }
                Op::Merge(p) => {
                    let new = merge_value(cur.as_deref(), p)?;
                    let len = new.len();
                    *cur = Some(new);
                    *changed = true;
                    Outcome::Merged(len)
                }
            });
        }
        // The batch's physical operations, and their undo (for a failure
        // half way, below).
        let mut redo = WriteBatch::new();
        let mut undo = WriteBatch::new();
        for (key, orig, cur, changed) in &state {
            if !changed {
                continue;
            }
            match cur {
                Some(v) => redo.put(key, v),
                None => redo.remove(key),
            }
            match orig {
                Some(v) => undo.put(key, v),
                None => undo.remove(key),
            }
        }
        let logged = redo.len() > 1;
        let ik = if logged {
            let len = redo.as_bytes().len();
            if len > index::MAX_VALUE - crate::value::STAMP_LEN {
                return Err(Error::RecordTooLarge(
                    len as u64,
                    (index::MAX_VALUE - crate::value::STAMP_LEN) as u64,
                ));
            }
            let k = intent_key(self.intent_slot()?);
            // 1. The intent, durable.
            self.h.put(&k, redo.as_bytes())?;
            self.h.sync()?;
            Some(k)
        } else {
            None
        };
        // 2. The operations, durable. Each is failure-atomic; when one fails
        // (a full heap) the ones before it are undone, and the intent goes
        // only once they are: else it stays, and the next open applies the
        // whole batch.
        if let Err((done, e)) = apply_ops(&mut self.h, &redo, usize::MAX) {
            if apply_ops(&mut self.h, &undo, done).is_ok() {
                if let Some(k) = &ik {
                    let _ = self.h.remove(k).and_then(|_| self.h.sync());
                }
            }
            return Err(e);
        }
        // 3. The intent gone, durable: a crash from here on finds none.
        if let Some(k) = ik {
            self.h.remove(&k)?;
            self.h.sync()?;
        }
        out.extend(outcomes);
        Ok(())
    }

    fn apply(&mut self, key: &[u8], op: Op<'_>) -> Result<Outcome> {
        check_op(key, &op)?;
        if is_intent_key(key) {
            return Err(Error::ReservedKey);
        }
        let s = self.inner.stripe(key);
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
            Op::Merge(p) => {
                // Resolved here, under the stripe lock: the piece's new value
                // is written whole (one failure-atomic put).
                let found = self.h.get(key, &mut self.buf)?;
                let new = merge_value(found.then_some(self.buf.as_slice()), p)?;
                self.h.put(key, &new)?;
                Outcome::Merged(new.len())
            }
        };
        // The acknowledgement waits for durability (the link cache may hold the
        // last link).
        self.h.sync()?;
        Ok(out)
    }
}
