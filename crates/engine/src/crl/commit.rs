//! Group commit: the durable watermark of each log, commits, and records
//! staged in DRAM and written through the file (see the module note's
//! "Append").

use super::{LogState, Pool, RecPtr};
use crate::Result;
use std::sync::atomic::Ordering;

/// A log's appended bytes not yet written to the file (see `Pool::stages`).
#[derive(Debug, Default)]
pub(super) struct Staged {
    /// Heap offset of the first byte.
    at: u64,
    bytes: Vec<u8>,
}

impl Staged {
    /// The staged copy of `[at, at+len)`, if all of it is staged.
    fn get(&self, at: u64, len: usize) -> Option<&[u8]> {
        let o = at.checked_sub(self.at)? as usize;
        self.bytes.get(o..o.checked_add(len)?)
    }
}

/// A staged run's buffer keeps at most this much capacity between commits.
const STAGED_KEEP: usize = 4 << 20;

impl Pool {
    /// Group commit: makes log `p.log()` durable up to the end of the record at
    /// `p`, or of the batch it belongs to (the whole prefix, so that recovery,
    /// which reads each log from its head while records check and takes a
    /// batch whole, reaches it). `p` is published (no batch is marked
    /// in progress on its key). Called before appending a record
    /// whose `prev` is `p`: a durable record's `prev` is then always durable and
    /// found by recovery, whichever writer's batch commits first.
    pub fn make_durable(&self, p: RecPtr) -> Result<()> {
        let l = &self.logs[p.log()];
        let from = l.durable.load(Ordering::Acquire);
        // The watermark only ever lands on unit ends (a published tail, a
        // record's end, a batch's end), so one past the record's start means
        // past the end of its unit: the common case costs no header read.
        if from > p.pos() {
            return Ok(());
        }
        let end = self.unit_end(p)?;
        self.make_durable_to(p.log(), end)
    }

    /// The end of the unit holding the published record at `p`: its own end,
    /// or for a batch's record the end of the batch's last record. The
    /// durable watermark only rises to such ends: a watermark inside a batch
    /// would let a gleaner apply part of a batch that recovery could still
    /// drop whole.
    pub(super) fn unit_end(&self, p: RecPtr) -> Result<u64> {
        let mut at = p;
        loop {
            let h = self.header(at)?;
            let end = at.pos() + h.len as u64;
            if !h.more {
                return Ok(end);
            }
            // A batch is contiguous (no pad inside: `Pool::reserve`).
            at = RecPtr::new(p.log(), end);
        }
    }

    /// Group commit: makes log `i` durable up to `end` (a record end or the
    /// published tail): by waiting for its writer's commit when that is under
    /// way and covers `end`, else by syncing the range itself.
    pub fn make_durable_to(&self, i: usize, end: u64) -> Result<()> {
        let l = &self.logs[i];
        if l.durable.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        // The log's writer is committing past the record: its fence is under
        // way, so wait for it rather than sync the same pages again (each sync
        // is a device flush of its own). Bounded: a commit takes about one
        // msync; after 50 ms this thread syncs itself.
        if l.committing.load(Ordering::Acquire) >= end {
            // A failed sync never raises the watermark: report it, not wait.
            self.r().health()?;
            let t = std::time::Instant::now();
            while l.durable.load(Ordering::Acquire) < end
                && t.elapsed() < std::time::Duration::from_millis(50)
            {
                std::thread::yield_now();
            }
            if l.durable.load(Ordering::Acquire) >= end {
                return Ok(());
            }
        }
        // Written to the file (by this thread, or by one that finished
        // before `staged_from` was cleared) before the flush below: the
        // fence syncs the pages with the records in them.
        self.write_staged(i)?;
        let from = l
            .durable
            .load(Ordering::Acquire)
            .max(end.saturating_sub(self.size));
        self.flush_positions(i, from, end);
        self.r().fence();
        l.durable.fetch_max(end, Ordering::AcqRel);
        Ok(())
    }

    /// Flushes log `i`'s positions `[from, to)` (at most a ring; no fence).
    /// Nothing when `from >= to`: a concurrent commit may have raised the
    /// watermark `from` was read from past `to` since the caller checked it.
    fn flush_positions(&self, i: usize, from: u64, to: u64) {
        if from >= to {
            return;
        }
        debug_assert!(to - from <= self.size);
        let base = self.logs[i].base.load(Ordering::Acquire);
        let r = self.r();
        let (a, b) = (from % self.size, to % self.size);
        if a < b || b == 0 {
            let stop = if b == 0 { self.size } else { b };
            r.flush(base + a, (stop - a) as usize);
        } else {
            r.flush(base + a, (self.size - a) as usize);
            r.flush(base, b as usize);
        }
    }

    /// Group commit: the caller is about to fence its appends to log `i`,
    /// positions `[start, end)` (then `mark_durable`); a writer that needs the
    /// log durable that far waits for that fence instead of issuing its own.
    ///
    /// When appends are staged (`stages`), writes the log's staged records to
    /// the file and then flushes `[start, end)`: the caller's fence (or its
    /// detached fence) syncs exactly what was written, after the write. (A
    /// flush at the append would queue the pages before the write, and any
    /// fence of the thread in between would sync them with their old bytes.)
    /// Bytes of the range that another thread wrote out earlier were flushed
    /// and fenced by it (`make_durable_to`); flushing them again costs a
    /// clean page. Otherwise the appends flushed their records themselves.
    pub fn committing(&self, i: usize, start: u64, end: u64) -> Result<()> {
        if self.stages() {
            self.write_staged(i)?;
            self.flush_positions(i, start.max(end.saturating_sub(self.size)), end);
        }
        self.logs[i].committing.fetch_max(end, Ordering::AcqRel);
        Ok(())
    }

    /// Whether appends are staged and written through the file at the commit
    /// (group commit, on a writable region not under the crash simulator).
    ///
    /// Why: under msync a store into a log page that an msync has cleaned
    /// takes a write-protect fault, and cleaning a page that a store dirtied
    /// write-protects it again, a TLB shootdown (an IPI to every core that ran
    /// the process lately: on a VM, exits on both sides), several of each per
    /// commit of a pipelined batch. Written with one `pwrite` per commit, the
    /// pages are never dirtied through the mapping: no fault, and nothing to
    /// shoot down (the mapping reads the same page cache).
    pub fn stages(&self) -> bool {
        self.through_file && self.group_commit.load(Ordering::Relaxed)
    }

    /// Stages `parts` and then `zeros` zero bytes at heap offset `at`, log
    /// position `pos`, after the log's staged run (written out first when
    /// `at` does not continue it: the buffer wrapped). With `checksum`, the
    /// parts are a record (header with a zero checksum, key, payload) and its
    /// checksum is computed over the staged copy and stored in it: the same
    /// value as `crc_parts`, in one pass over contiguous bytes (crc32fast
    /// folds with `pclmulqdq` from 128 bytes on, and a record's four parts
    /// are each shorter).
    pub(super) fn stage(
        &self,
        i: usize,
        pos: u64,
        at: u64,
        parts: &[&[u8]],
        zeros: usize,
        checksum: bool,
    ) -> Result<()> {
        let l = &self.logs[i];
        let mut st = l.staged.lock().unwrap_or_else(|e| e.into_inner());
        if !st.bytes.is_empty() && st.at + st.bytes.len() as u64 != at {
            self.write_staged_locked(l, &mut st)?;
        }
        if st.bytes.is_empty() {
            st.at = at;
            // Before the record is published (tail, frontend entry): a
            // reader that finds it also finds it staged.
            l.staged_from.store(pos, Ordering::Release);
        }
        let start = st.bytes.len();
        for p in parts {
            st.bytes.extend_from_slice(p);
        }
        if checksum {
            let rec = &mut st.bytes[start..];
            // As `crc_parts`: the checksum field is zero while hashing.
            debug_assert!(rec[12..16] == [0; 4]);
            let mut h = crc32fast::Hasher::new();
            h.update(&self.salt.to_le_bytes());
            h.update(rec);
            rec[12..16].copy_from_slice(&h.finalize().to_le_bytes());
        }
        let n = st.bytes.len() + zeros;
        st.bytes.resize(n, 0);
        Ok(())
    }

    /// Writes log `i`'s staged bytes to the file (any thread).
    pub fn write_staged(&self, i: usize) -> Result<()> {
        let l = &self.logs[i];
        if l.staged_from.load(Ordering::Acquire) == u64::MAX {
            return Ok(());
        }
        let mut st = l.staged.lock().unwrap_or_else(|e| e.into_inner());
        self.write_staged_locked(l, &mut st)
    }

    fn write_staged_locked(&self, l: &LogState, st: &mut Staged) -> Result<()> {
        if st.bytes.is_empty() {
            return Ok(());
        }
        // On a failure the bytes stay staged (readers still find them) and
        // the region is marked failed: no commit succeeds from now on.
        self.r().write_through(st.at, &st.bytes)?;
        // After the write: a reader that sees no staged run reads the file.
        l.staged_from.store(u64::MAX, Ordering::Release);
        st.bytes.clear();
        if st.bytes.capacity() > STAGED_KEEP {
            st.bytes.shrink_to(STAGED_KEEP);
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes at `off` into the record at `p` from the
    /// log's staged run; false (nothing copied) when they are in the file.
    #[inline]
    pub(super) fn read_staged(&self, p: RecPtr, off: u64, dst: &mut [u8]) -> bool {
        let l = &self.logs[p.log()];
        if p.pos() + off + (dst.len() as u64) <= l.staged_from.load(Ordering::Acquire) {
            return false;
        }
        self.read_staged_locked(l, p, off, dst)
    }

    #[cold]
    #[inline(never)]
    fn read_staged_locked(&self, l: &LogState, p: RecPtr, off: u64, dst: &mut [u8]) -> bool {
        let st = l.staged.lock().unwrap_or_else(|e| e.into_inner());
        match st.get(self.at(p) + off, dst.len()) {
            Some(src) => {
                dst.copy_from_slice(src);
                true
            }
            None => false,
        }
    }

    /// Copies bytes of the record at `p` (from `off`), staged or in the file.
    #[inline]
    pub(super) fn read_record(&self, p: RecPtr, off: u64, dst: &mut [u8]) {
        if !self.read_staged(p, off, dst) {
            self.r().read_bytes(self.at(p) + off, dst);
        }
    }

    /// Whether the record at `p` (of `len` bytes) is durable. Always, unless
    /// the pool defers fences to a group commit and its writer has not committed
    /// it yet (nor anyone synced the log past it).
    pub fn is_durable(&self, p: RecPtr, len: u64) -> bool {
        self.logs[p.log()].durable.load(Ordering::Acquire) >= p.pos() + len
    }

    /// Group commit: makes every log durable up to its published tail (records
    /// appended but not yet committed by their writers). For a writer that
    /// waits for log space and for a drain: gleaners apply only durable records.
    pub fn make_all_durable(&self) -> Result<()> {
        for i in 0..self.logs.len() {
            let tail = self.logs[i].tail.load(Ordering::Acquire);
            self.make_durable_to(i, tail)?;
        }
        Ok(())
    }

    /// Group commit: the caller fenced its appends to log `i` up to `end`.
    pub fn mark_durable(&self, i: usize, end: u64) {
        self.logs[i].durable.fetch_max(end, Ordering::AcqRel);
    }
}
