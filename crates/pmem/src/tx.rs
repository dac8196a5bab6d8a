//! Failure-atomic redo-log transactions (Bullet §3, Figure 4).
//!
//! Each thread slot owns a redo log area. A transaction appends its writes there
//! (no flushes until commit); writes into blocks it allocated itself go straight to
//! the block, since nothing can reach those before commit. Commit:
//!
//! 1. flush the lines written in the transaction's fresh blocks and the log records;
//!    if the transaction allocated, **fence** (fresh contents and allocation bits are
//!    durable before the commit record can be: the checksum covers only the records);
//! 2. write the log header {magic, state=COMMITTED, len, crc32(records ++ len)} and
//!    flush it; **fence** (the commit point);
//! 3. copy every record to its home location and flush it; **fence**;
//! 4. clear the header (state, len, crc = 0), flush; **fence** (the log can never
//!    be replayed over later writes);
//! 5. free the blocks the transaction freed (their pages were made active when
//!    `free` was called, so a crash here leaves them to the leak sweep); **fence**.
//!
//! Recovery replays a log whose header is COMMITTED and whose checksum matches, then
//! clears it; a COMMITTED header that fails the checksum is torn (the crash came
//! before step 2's fence) and is cleared, persisted; an uncommitted one is
//! skipped.
//!
//! Recovery does not find the log's end by reading records while they check
//! (as the engine's record logs do, which is why their records carry the
//! generation of the open that wrote them): the header gives the length, and a
//! COMMITTED header exists only from a commit point until step 4's fence,
//! before the slot's next transaction writes any record (and recovery clears a
//! torn or replayed header, persisted, before the heap is used). So a header a
//! crash keeps is always the last transaction's, and records left from an
//! earlier transaction (or an earlier run) where the last one's were lost fail
//! its checksum: nothing from before a crash can be replayed after the next.
//! Concurrency control is the caller's (Bullet §3): hold your locks until commit
//! returns.

use crate::error::{Error, Result};
use crate::heap::{FreeTicket, Heap, ThreadHeap};
use crate::layout::Geometry;
use crate::pptr::PPtr;
use bytemuck::Pod;
use std::sync::atomic::Ordering;

const TX_MAGIC: u32 = 0x5854_4d45; // "EMTX"
const COMMITTED: u32 = 1;
const HDR: u64 = 64;

struct WriteRec {
    dst: u64,
    len: u64,
    data: u64, // offset of the data in the log area
}

pub(crate) struct TxState {
    log_off: u64,
    log_cap: u64,
    depth: u32,
    cursor: u64,
    crc: crc32fast::Hasher,
    writes: Vec<WriteRec>,
    fresh: Vec<(u64, u64)>,
    fresh_dirty: Vec<(u64, u64)>,
    frees: Vec<FreeTicket>,
}

impl TxState {
    pub fn new(geo: &Geometry, slot: usize) -> Self {
        Self {
            log_off: geo.log_off(slot),
            log_cap: geo.log_size,
            depth: 0,
            cursor: 0,
            crc: crc32fast::Hasher::new(),
            writes: Vec::new(),
            fresh: Vec::new(),
            fresh_dirty: Vec::new(),
            frees: Vec::new(),
        }
    }

    fn reset(&mut self) {
        self.depth = 0;
        self.cursor = 0;
        self.crc = crc32fast::Hasher::new();
        self.writes.clear();
        self.fresh.clear();
        self.fresh_dirty.clear();
        self.frees.clear();
    }
}

/// The outcome of a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxOutcome {
    /// The transaction's effects are durable.
    Committed,
    /// An inner (flat-nested) commit: nothing is durable until the outermost commits.
    Nested,
}

/// A failure-atomic transaction. Dropping it without `commit` aborts it.
pub struct Tx<'a> {
    th: &'a mut ThreadHeap,
    done: bool,
}

impl ThreadHeap {
    /// `txn_begin`: starts a transaction on this thread's redo log.
    pub fn begin(&mut self) -> Tx<'_> {
        self.tx_state.reset();
        Tx {
            th: self,
            done: false,
        }
    }

    /// Runs `f` in a transaction; commits on `Ok`, aborts on `Err`.
    pub fn transaction<R>(&mut self, f: impl FnOnce(&mut Tx<'_>) -> Result<R>) -> Result<R> {
        let mut tx = self.begin();
        let r = f(&mut tx)?;
        tx.commit()?;
        Ok(r)
    }
}

impl<'a> Tx<'a> {
    fn heap(&self) -> &Heap {
        &self.th.heap
    }

    /// Flat nesting: an inner `begin` joins this transaction.
    pub fn begin_nested(&mut self) {
        self.th.tx_state.depth += 1;
    }

    /// Ends an inner transaction; its effects commit with the outermost one.
    pub fn commit_nested(&mut self) -> Result<TxOutcome> {
        let st = &mut self.th.tx_state;
        if st.depth == 0 {
            return Err(Error::TxNesting);
        }
        st.depth -= 1;
        Ok(TxOutcome::Nested)
    }

    /// Runs `f` as a flat-nested transaction inside this one.
    pub fn nested<R>(&mut self, f: impl FnOnce(&mut Tx<'a>) -> Result<R>) -> Result<R> {
        self.begin_nested();
        let r = f(self)?;
        self.commit_nested()?;
        Ok(r)
    }

    fn fresh_block_of(&self, off: u64, len: u64) -> bool {
        self.th
            .tx_state
            .fresh
            .iter()
            .any(|&(s, l)| off >= s && off + len <= s + l)
    }

    /// `txn_write`: writes `src` at heap offset `dst`, atomically with the rest.
    pub fn write(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        let len = src.len() as u64;
        let region = self.th.heap.inner.region_ref();
        let hs = region.geometry().header_size();
        if dst < hs || !region.contains(dst, len) {
            return Err(Error::InvalidPointer(
                dst,
                "transactional write outside the chunk area",
            ));
        }
        if self.fresh_block_of(dst, len) {
            region.write_bytes(dst, src);
            self.th.tx_state.fresh_dirty.push((dst, len));
            return Ok(());
        }
        let st = &mut self.th.tx_state;
        let rec = 16 + len.next_multiple_of(8);
        if HDR + st.cursor + rec > st.log_cap {
            return Err(Error::TxLogFull(st.log_cap as usize));
        }
        let at = st.log_off + HDR + st.cursor;
        let mut head = [0u8; 16];
        head[..8].copy_from_slice(&dst.to_le_bytes());
        head[8..].copy_from_slice(&len.to_le_bytes());
        region.write_bytes(at, &head);
        region.write_bytes(at + 16, src);
        let pad = (rec - 16 - len) as usize;
        if pad > 0 {
            region.write_bytes(at + 16 + len, &[0u8; 8][..pad]);
        }
        st.crc.update(&head);
        st.crc.update(src);
        st.crc.update(&[0u8; 8][..pad]);
        st.writes.push(WriteRec {
            dst,
            len,
            data: at + 16,
        });
        st.cursor += rec;
        Ok(())
    }

    /// `txn_read`: reads `dst.len()` bytes at `src`, seeing this transaction's writes.
    pub fn read(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        let region = self.th.heap.inner.region_ref();
        let len = dst.len() as u64;
        if !region.contains(src, len) {
            return Err(Error::InvalidPointer(
                src,
                "transactional read outside the heap",
            ));
        }
        region.read_bytes(src, dst);
        for w in &self.th.tx_state.writes {
            let s = w.dst.max(src);
            let e = (w.dst + w.len).min(src + len);
            if s < e {
                region.read_bytes(
                    w.data + (s - w.dst),
                    &mut dst[(s - src) as usize..(e - src) as usize],
                );
            }
        }
        Ok(())
    }

    pub fn write_val<T: Pod>(&mut self, p: PPtr<T>, v: &T) -> Result<()> {
        self.write(p.offset(), bytemuck::bytes_of(v))
    }

    pub fn read_val<T: Pod>(&self, p: PPtr<T>) -> Result<T> {
        let mut v = T::zeroed();
        self.read(p.offset(), bytemuck::bytes_of_mut(&mut v))?;
        Ok(v)
    }

    pub fn write_u64(&mut self, off: u64, v: u64) -> Result<()> {
        self.write(off, &v.to_le_bytes())
    }

    pub fn read_u64(&self, off: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(off, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// `pm_alloc(txn, len)`: a block that is freed again if the transaction aborts or
    /// never commits. Writes into it through this transaction are not logged.
    pub fn alloc(&mut self, size: u64) -> Result<PPtr<u8>> {
        let p = self.th.alloc(size)?;
        let usable = self.th.heap.usable_size(p)?;
        self.th.tx_state.fresh.push((p.offset(), usable));
        Ok(p)
    }

    /// `pm_free(txn, addr)`: the block is freed when (and only if) the transaction
    /// commits.
    pub fn free(&mut self, p: PPtr<u8>) -> Result<()> {
        let off = p.offset();
        if let Some(i) = self.th.tx_state.fresh.iter().position(|&(s, _)| s == off) {
            let (_, usable) = self.th.tx_state.fresh.swap_remove(i);
            self.th
                .tx_state
                .fresh_dirty
                .retain(|&(s, _)| s < off || s >= off + usable);
            return self.th.free(p);
        }
        let t = self.th.prepare_free_in_tx(p)?;
        self.th.tx_state.frees.push(t);
        Ok(())
    }

    /// `txn_commit`: makes the transaction durable (outermost level only).
    pub fn commit(mut self) -> Result<TxOutcome> {
        if self.th.tx_state.depth != 0 {
            return Err(Error::TxNesting);
        }
        self.done = true;
        let heap = self.heap().clone();
        let region = heap.inner.region_ref();
        let st = &mut self.th.tx_state;
        if st.writes.is_empty() && st.fresh.is_empty() && st.frees.is_empty() {
            st.reset();
            self.th.end_op();
            return Ok(TxOutcome::Committed);
        }
        for &(off, len) in &st.fresh_dirty {
            region.flush(off, len as usize);
        }
        if !st.writes.is_empty() {
            region.flush(st.log_off + HDR, st.cursor as usize);
        }
        if !st.fresh.is_empty() || st.frees.iter().any(|t| t.apt != 0) {
            // The commit record must not become durable before the fresh blocks'
            // contents and allocation bits do (the checksum covers only the
            // records), nor before the block entries of the blocks it unlinks.
            region.fence();
        }
        if !st.writes.is_empty() {
            let len = st.cursor;
            let mut h = std::mem::replace(&mut st.crc, crc32fast::Hasher::new());
            h.update(&len.to_le_bytes());
            let crc = h.finalize();
            let mut hdr = [0u8; 24];
            hdr[0..4].copy_from_slice(&TX_MAGIC.to_le_bytes());
            hdr[4..8].copy_from_slice(&COMMITTED.to_le_bytes());
            hdr[8..16].copy_from_slice(&len.to_le_bytes());
            hdr[16..20].copy_from_slice(&crc.to_le_bytes());
            region.write_bytes(st.log_off, &hdr);
            region.flush(st.log_off, 24);
        }
        region.fence(); // commit point
        self.th.fenced();
        let st = &mut self.th.tx_state;
        if !st.writes.is_empty() {
            let mut buf = Vec::new();
            for w in &st.writes {
                buf.resize(w.len as usize, 0);
                region.read_bytes(w.data, &mut buf);
                region.write_bytes(w.dst, &buf);
                region.flush(w.dst, w.len as usize);
            }
            region.fence();
            clear_header(region, st.log_off);
            region.fence();
        }
        let frees = std::mem::take(&mut st.frees);
        st.reset();
        self.th.end_op();
        if !frees.is_empty() {
            self.th.redeem_own(frees)?;
        }
        Ok(TxOutcome::Committed)
    }

    /// Abandons the transaction: nothing it wrote becomes visible, blocks it
    /// allocated are freed, blocks it freed stay allocated.
    pub fn abort(mut self) {
        self.rollback();
    }

    fn rollback(&mut self) {
        self.done = true;
        let fresh = std::mem::take(&mut self.th.tx_state.fresh);
        let frees = std::mem::take(&mut self.th.tx_state.frees);
        self.th.tx_state.reset();
        for (off, _) in fresh {
            // Unreachable by construction; an error here would be a bug upstream.
            let _ = self.th.free(PPtr::from_raw(off));
        }
        for t in frees {
            self.th.heap.cancel_ticket(t);
        }
        self.th.end_op();
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.rollback();
        }
    }
}

fn clear_header(region: &crate::region::Region, log_off: u64) {
    region.write_bytes(log_off + 4, &[0u8; 16]);
    region.flush(log_off, 24);
}

/// Replays every committed log (step 3 of the heap's recovery path in
/// ARCHITECTURE.md). Returns how many were replayed.
pub(crate) fn recover_all(heap: &Heap) -> Result<u64> {
    let region = heap.inner.region_ref();
    let geo = region.geometry();
    let hs = geo.header_size();
    let mut n = 0;
    for slot in 0..geo.nslots as usize {
        let lo = geo.log_off(slot);
        let magic: u32 = region.read(lo);
        let state: u32 = region.read(lo + 4);
        if magic != TX_MAGIC || state != COMMITTED {
            continue;
        }
        let len: u64 = region.read(lo + 8);
        let crc: u32 = region.read(lo + 16);
        // A torn header (the crash came before the commit fence) is not a commit.
        // Clear it, durably, so that it can never validate against the records of
        // a later transaction of this slot that repeat the torn one's first records.
        let torn = |region: &crate::region::Region| {
            region.write::<u32>(lo + 4, &0);
            region.write::<u64>(lo + 8, &0);
            region.write::<u32>(lo + 16, &0);
            region.persist(lo, HDR as usize);
        };
        if len > geo.log_size - HDR {
            torn(region);
            continue;
        }
        let mut recs = vec![0u8; len as usize];
        region.read_bytes(lo + HDR, &mut recs);
        let mut h = crc32fast::Hasher::new();
        h.update(&recs);
        h.update(&len.to_le_bytes());
        if h.finalize() != crc {
            torn(region);
            continue;
        }
        // Validate every record before applying any.
        let mut at = 0usize;
        let mut list = Vec::new();
        while at < recs.len() {
            if at + 16 > recs.len() {
                return Err(corrupt(heap, slot, "record header past end"));
            }
            let dst = u64::from_le_bytes(recs[at..at + 8].try_into().unwrap());
            let l = u64::from_le_bytes(recs[at + 8..at + 16].try_into().unwrap());
            let end = l
                .checked_next_multiple_of(8)
                .and_then(|l8| (at as u64 + 16).checked_add(l8));
            let Some(end) = end else {
                return Err(corrupt(heap, slot, "a record length that overflows"));
            };
            if end > recs.len() as u64 || dst < hs || !region.contains(dst, l) {
                return Err(corrupt(heap, slot, "record outside the log or the heap"));
            }
            list.push((dst, at + 16, l as usize));
            at = end as usize;
        }
        for (dst, d, l) in list {
            region.write_bytes(dst, &recs[d..d + l]);
            region.flush(dst, l);
        }
        region.fence();
        clear_header(region, lo);
        region.fence();
        n += 1;
    }
    Ok(n)
}

fn corrupt(heap: &Heap, slot: usize, what: &str) -> Error {
    Error::Corrupt {
        path: heap.region().path().to_path_buf(),
        detail: format!("committed redo log of slot {slot} has a valid checksum but {what}"),
    }
}

/// Whether slot `slot` holds a committed log awaiting replay (for `check`).
pub(crate) fn pending_log(heap: &Heap, slot: usize) -> bool {
    let region = heap.region();
    let lo = region.geometry().log_off(slot);
    let magic: u32 = region.read(lo);
    let state: u32 = region.read(lo + 4);
    magic == TX_MAGIC
        && state == COMMITTED
        && region.atomic_u64(lo + 8).load(Ordering::Relaxed) != 0
}
