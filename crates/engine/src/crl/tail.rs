//! Finding each log's tail at recovery (records read from the head while
//! they check), and the generation floors that bound it (see the module
//! note's "Generations").

use super::{
    crc, floor_word, gen_follows, Header, Pool, RecPtr, FLOOR_TAG_BITS, FLOOR_TAG_MASK, GEN_MASK,
    LOG_FLOOR, ROOT_VERSION,
};
use std::sync::atomic::Ordering;

impl Pool {
    /// Every log's tail (`find_tail`), the logs split over up to two threads:
    /// after a crash under load each log is read whole from the disk, and
    /// two readers keep the device busier than one (the checksums too are
    /// computed on both cores).
    pub(super) fn find_tails(&self) -> Vec<(usize, u64)> {
        let n = self.logs.len();
        let threads = std::thread::available_parallelism()
            .map_or(1, |p| p.get())
            .min(2)
            .min(n);
        if threads < 2 {
            return (0..n).map(|i| (i, self.find_tail(i))).collect();
        }
        let mut out: Vec<(usize, u64)> = std::thread::scope(|s| {
            let other = s.spawn(|| {
                (1..n)
                    .step_by(2)
                    .map(|i| (i, self.find_tail(i)))
                    .collect::<Vec<_>>()
            });
            let mut mine: Vec<(usize, u64)> =
                (0..n).step_by(2).map(|i| (i, self.find_tail(i))).collect();
            mine.extend(
                other
                    .join()
                    .unwrap_or_else(|e| std::panic::resume_unwind(e)),
            );
            mine
        });
        out.sort_unstable();
        out
    }

    /// The tail of log `i`: reads records from the head while they check, and
    /// ends after the last whole batch (see [`super::OPC_MORE`]).
    fn find_tail(&self, i: usize) -> u64 {
        let l = &self.logs[i];
        if l.base.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let head = l.head.load(Ordering::Acquire);
        let mut gen = self.floor(i, head);
        let mut pos = head;
        // The end of the last whole unit (a record, or a batch: records with
        // `more` up to one without): records after it belong to a batch that
        // a crash cut short, never acknowledged, and are not live.
        let mut end = head;
        let mut buf = Vec::new();
        loop {
            let p = self.skip_gap(pos);
            if p - head >= self.size {
                return end;
            }
            let ptr = RecPtr::new(i, p);
            match self.header(ptr) {
                Ok(h)
                    if p - head + h.len as u64 <= self.size
                        && gen_follows(gen, h.gen)
                        && self.checks(ptr, &h, &mut buf) =>
                {
                    gen = h.gen;
                    pos = p + h.len as u64;
                    if !h.more {
                        end = pos;
                    }
                }
                _ => return end,
            }
        }
    }

    /// Log `i`'s generation floor as persisted with head `head` (0, no
    /// floor, when the floor word belongs to another head: a crash between
    /// their writes, or a store from before floors).
    fn floor(&self, i: usize, head: u64) -> u32 {
        let w: u64 = self.r().read(self.log_field(i, LOG_FLOOR));
        if w & FLOOR_TAG_MASK == head & FLOOR_TAG_MASK {
            (w >> FLOOR_TAG_BITS) as u32 & GEN_MASK
        } else {
            0
        }
    }

    /// The generation floor for log `i` with head `head` (at or above the
    /// read boundary, so its record is not reclaimed under this call): the
    /// generation of the record at the head, or, when the head is at the
    /// tail, this open's (a record written there from now on is this open's
    /// or a later one's).
    pub(super) fn floor_for(&self, i: usize, head: u64) -> u32 {
        let p = self.skip_gap(head);
        if p >= self.logs[i].tail.load(Ordering::Acquire) {
            return self.gen;
        }
        // A live record's header always reads; 0 (no floor) otherwise.
        self.header(RecPtr::new(i, p)).map_or(0, |h| h.gen)
    }

    /// Opening a store read-write, before any append: persists each log's
    /// generation floor for its recovered head (a drained log's floor is this
    /// open's generation), and upgrades a descriptor from before generations
    /// to `ROOT_VERSION`. Refreshed at every open, a floor is never more than
    /// the oldest live record's age behind the current generation.
    pub fn persist_floors(&self) {
        let r = self.r();
        if r.access() != pmem::Access::ReadWrite {
            return;
        }
        for (i, l) in self.logs.iter().enumerate() {
            if l.base.load(Ordering::Acquire) == 0 {
                continue;
            }
            let head = l.head.load(Ordering::Acquire);
            let f = self.log_field(i, LOG_FLOOR);
            r.write(f, &floor_word(self.floor_for(i, head), head));
            r.flush(f, 8);
        }
        let ver: u32 = r.read(self.desc + 4);
        if ver != ROOT_VERSION {
            r.write(self.desc + 4, &ROOT_VERSION);
            r.flush(self.desc + 4, 4);
        }
        r.fence();
    }

    /// Whether the record at `p` is whole: its checksum matches (`buf` is scratch).
    fn checks(&self, p: RecPtr, h: &Header, buf: &mut Vec<u8>) -> bool {
        buf.resize(h.len as usize, 0);
        self.read_record(p, 0, buf);
        let stored = u32::from_le_bytes(buf[12..16].try_into().expect("4 bytes"));
        crc(self.salt, buf) == stored
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;

    fn pool(heap: &Heap) -> (u64, Pool) {
        let desc = Pool::create_desc(heap, 1, 8192, BACKEND_HASH, PPtr::from_raw(0)).unwrap();
        let pool = Pool::attach(heap, desc).unwrap();
        pool.ensure_buffer(0).unwrap();
        (desc, pool)
    }

    fn append_as(pool: &mut Pool, gen: u32, key: &[u8]) -> RecPtr {
        pool.gen = gen;
        pool.append(0, 1, key, &[7; 60], RecPtr::NULL, 1)
            .unwrap()
            .unwrap()
    }

    fn end(pool: &Pool, p: RecPtr) -> u64 {
        p.pos() + pool.header(p).unwrap().len as u64
    }

    #[test]
    fn generations_compare_as_serial_numbers() {
        assert!(gen_follows(5, 5) && gen_follows(5, 6) && !gen_follows(6, 5));
        assert!(
            gen_follows(GEN_MASK, 1),
            "wraps past 2^24 - 1 (0 is skipped)"
        );
        assert!(!gen_follows(1, GEN_MASK));
        assert!(gen_follows(1, 1 << 22) && !gen_follows(1 << 22, 1));
        assert!(
            gen_follows(1 << 23 | 2, 1),
            "less than 2^23 ahead, past the wrap"
        );
        assert!(
            gen_follows(0, 0) && gen_follows(0, 9),
            "no generation first"
        );
        assert!(!gen_follows(9, 0), "none after one");
        for g in [1, 2, GEN_MASK as u64, GEN_MASK as u64 + 1, u64::MAX] {
            let r = record_gen(g);
            assert!((1..=GEN_MASK).contains(&r), "{g} -> {r}");
        }
        assert_eq!(record_gen(GEN_MASK as u64 + 1), 1);
    }

    /// Recovery reads records while their generations do not decrease: one
    /// of an older open after a newer one's is where the log ends.
    #[test]
    fn an_older_generation_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let heap = Heap::create(
            &dir.path().join("h"),
            &crate::test_heap_opts(8 << 20, 8 << 20),
        )
        .unwrap();
        let (desc, mut pool) = pool(&heap);
        let _a = append_as(&mut pool, 3, b"a");
        let b = append_as(&mut pool, 4, b"b");
        let _c = append_as(&mut pool, 2, b"c");
        let h = pool.header(b).unwrap();
        assert_eq!(
            (h.gen, h.pos),
            (4, b.pos()),
            "the generation and position read back"
        );
        let again = Pool::attach(&heap, desc).unwrap();
        assert_eq!(again.logs[0].tail.load(Ordering::Acquire), end(&pool, b));
    }

    /// A store from before generations (descriptor version 3, records with
    /// generation 0) opens: its records are found, the descriptor is upgraded
    /// before the first append, and records appended after them are found
    /// too; a generation-0 record behind a newer one is not.
    #[test]
    fn records_from_before_generations_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let heap = Heap::create(
            &dir.path().join("h"),
            &crate::test_heap_opts(8 << 20, 8 << 20),
        )
        .unwrap();
        let (desc, mut pool) = pool(&heap);
        let r = heap.region();
        r.write(desc + 4, &ROOT_VERSION_NO_GEN);
        r.persist(desc + 4, 4);
        let _old1 = append_as(&mut pool, 0, b"old1");
        let old2 = append_as(&mut pool, 0, b"old2");

        let mut again = Pool::attach(&heap, desc).unwrap();
        assert_eq!(again.logs[0].tail.load(Ordering::Acquire), end(&pool, old2));
        again.persist_floors();
        assert_eq!(r.read::<u32>(desc + 4), ROOT_VERSION);
        let new = append_as(&mut again, 6, b"new");
        let stale = append_as(&mut again, 0, b"stale");
        assert!(again.header(stale).is_ok());
        let third = Pool::attach(&heap, desc).unwrap();
        assert_eq!(third.logs[0].tail.load(Ordering::Acquire), end(&again, new));
    }

    /// A drained log's floor is the generation of the open that persisted
    /// its head: a checksum-valid record of an older open at the head is not
    /// live. A floor word torn from its head (another head) is ignored.
    #[test]
    fn a_drained_head_rejects_an_older_generation() {
        let dir = tempfile::tempdir().unwrap();
        let heap = Heap::create(
            &dir.path().join("h"),
            &crate::test_heap_opts(8 << 20, 8 << 20),
        )
        .unwrap();
        let (desc, mut pool) = pool(&heap);
        let a = append_as(&mut pool, 3, b"a");
        let b = append_as(&mut pool, 3, b"b");
        // Drained to b's position by an open of generation 5 (b's record
        // then read as a stale one: the log's tail was a's end).
        pool.gen = 5;
        pool.logs[0].tail.store(end(&pool, a), Ordering::Release);
        pool.logs[0].head.store(b.pos(), Ordering::Release);
        pool.persist_heads(&[(0, b.pos())]);
        let again = Pool::attach(&heap, desc).unwrap();
        assert_eq!(again.logs[0].tail.load(Ordering::Acquire), b.pos());
        // The same head with the floor of another head: no floor.
        let f = pool.log_field(0, LOG_FLOOR);
        heap.region().write(f, &floor_word(5, a.pos()));
        heap.region().persist(f, 8);
        let torn = Pool::attach(&heap, desc).unwrap();
        assert_eq!(torn.logs[0].tail.load(Ordering::Acquire), end(&pool, b));
    }

    /// Appends a batch of `n` records to log 0 (unpublished until the
    /// end) and returns them.
    fn batch(pool: &Pool, n: usize, tag: u8) -> Vec<RecPtr> {
        let len = record_len(1, 60) * n as u64;
        let mut pos = pool.reserve(0, len).unwrap().unwrap();
        let recs = (0..n)
            .map(|i| {
                pool.put_record(0, &mut pos, 1, i + 1 < n, &[tag], &[7; 60], RecPtr::NULL, 1)
                    .unwrap()
            })
            .collect();
        pool.publish(0, pos);
        recs
    }

    /// Recovery takes a batch whole or not at all: the log ends after the
    /// last record without the `more` bit, so a batch whose last record did
    /// not check (a crash cut it short) is not live, wherever it was torn.
    /// A head inside a whole batch reads on to its end. `make_durable` of a
    /// batch's record covers the whole batch.
    #[test]
    fn a_batch_cut_short_is_not_live() {
        let dir = tempfile::tempdir().unwrap();
        let heap = Heap::create(
            &dir.path().join("h"),
            &crate::test_heap_opts(8 << 20, 8 << 20),
        )
        .unwrap();
        let (desc, pool) = pool(&heap);
        let single = pool
            .append(0, 1, b"s", &[1; 60], RecPtr::NULL, 1)
            .unwrap()
            .unwrap();
        let whole = batch(&pool, 3, b'w');
        let h = pool.header(whole[0]).unwrap();
        assert!(h.more && h.opcode == 1, "the bit is read apart: {h:?}");
        assert!(!pool.header(whole[2]).unwrap().more);
        let after_whole = end(&pool, whole[2]);
        assert_eq!(pool.unit_end(whole[0]).unwrap(), after_whole);
        let torn = batch(&pool, 3, b't');
        let again = Pool::attach(&heap, desc).unwrap();
        assert_eq!(
            again.logs[0].tail.load(Ordering::Acquire),
            end(&pool, torn[2])
        );
        for (cut, &rec) in torn.iter().enumerate() {
            // A byte of record `cut` of the last batch lost: a bad checksum.
            let at = pool.at(rec) + REC_HDR;
            let r = heap.region();
            let b: u8 = r.read(at);
            r.write(at, &(b ^ 0xff));
            r.persist(at, 1);
            let again = Pool::attach(&heap, desc).unwrap();
            assert_eq!(
                again.logs[0].tail.load(Ordering::Acquire),
                after_whole,
                "record {cut} of 3 torn"
            );
            r.write(at, &b);
            r.persist(at, 1);
        }
        // A head in the middle of the whole batch (its first record applied).
        pool.logs[0].head.store(whole[1].pos(), Ordering::Release);
        pool.persist_heads(&[(0, whole[1].pos())]);
        let again = Pool::attach(&heap, desc).unwrap();
        assert_eq!(
            again.logs[0].tail.load(Ordering::Acquire),
            end(&pool, torn[2])
        );
        assert!(single.pos() < whole[0].pos());
    }

    /// Group commit: making a batch's record durable (for a later record of
    /// its key in another log, or a read) makes the whole batch durable, so
    /// the watermark never lands inside a batch and no gleaner applies part
    /// of one that recovery could still drop.
    #[test]
    fn make_durable_covers_the_whole_batch() {
        let dir = tempfile::tempdir().unwrap();
        let heap = Heap::create(
            &dir.path().join("h"),
            &crate::test_heap_opts(8 << 20, 8 << 20),
        )
        .unwrap();
        let (_, pool) = pool(&heap);
        pool.group_commit.store(true, Ordering::Relaxed);
        let recs = batch(&pool, 3, b'g');
        let l = &pool.logs[0];
        assert!(l.durable.load(Ordering::Acquire) <= recs[0].pos());
        pool.make_durable(recs[0]).unwrap();
        assert_eq!(l.durable.load(Ordering::Acquire), end(&pool, recs[2]));
        let single = pool
            .append(0, 1, b"s", &[1; 60], RecPtr::NULL, 2)
            .unwrap()
            .unwrap();
        pool.make_durable(single).unwrap();
        assert_eq!(l.durable.load(Ordering::Acquire), end(&pool, single));
    }
}
