//! Shared helpers of the pmem integration tests (sigkill, model, regression).
//!
//! A persistent test structure rooted at `heap.root()`: a *table* block
//!
//! ```text
//! 0   magic u64
//! 8   nslots u64
//! 16  counter u64      bumped by every multi-slot transaction
//! 24  reserved u64
//! 32  slot pointers    nslots x u64 (0 = empty)
//! ```
//!
//! and one *data block* per occupied slot, self-describing so that corruption, a torn
//! write or a block of the wrong slot is detected:
//!
//! ```text
//! 0   len u64          bytes of the block that carry content (<= usable size)
//! 8   seq u64          unique per written content
//! 16  slot u64         the slot the block was written for
//! 24  group u64        the table counter of the multi-slot tx that wrote it (0 = none)
//! 32  check u64        hash of the four words above
//! 40  pattern          words derived from (seq, len, word index) up to len
//! ```
#![allow(dead_code)]

use pmem::{Error, FreeTicket, Geometry, Heap, HeapOptions, PPtr, Region, ThreadHeap};
use std::collections::{BTreeMap, HashSet};

pub const TABLE_MAGIC: u64 = 0x454d_4254_4142_4c31; // "EMBTABL1"
pub const T_HDR: u64 = 32;
pub const B_HDR: u64 = 40;
/// Largest block rewritten in place by a transaction (must fit the small redo log).
pub const MAX_INPLACE: u64 = 4096;

/// A small heap: 1 MiB chunks, 4 thread slots, 16 KiB redo logs.
pub fn small_opts(size: u64, max_size: u64) -> HeapOptions {
    HeapOptions {
        size,
        max_size,
        geometry: Geometry::small(),
        ..Default::default()
    }
}

/// splitmix64 finaliser.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// What a data block says about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockInfo {
    pub len: u64,
    pub seq: u64,
    pub slot: u64,
    pub group: u64,
}

impl BlockInfo {
    pub fn new(len: u64, seq: u64, slot: usize, group: u64) -> Self {
        assert!(len >= B_HDR && len.is_multiple_of(8), "bad block len {len}");
        BlockInfo {
            len,
            seq,
            slot: slot as u64,
            group,
        }
    }

    fn check(&self) -> u64 {
        mix(self.len ^ mix(self.seq ^ mix(self.slot ^ mix(self.group))))
    }

    fn word(&self, i: u64) -> u64 {
        mix(self.seq.rotate_left(21) ^ self.len ^ i.wrapping_mul(0x2545_F491_4F6C_DD1D))
    }

    /// The full content of the block.
    pub fn bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len as usize);
        for w in [self.len, self.seq, self.slot, self.group, self.check()] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        let words = (self.len - B_HDR) / 8;
        for i in 0..words {
            v.extend_from_slice(&self.word(i).to_le_bytes());
        }
        v
    }

    /// Encodes for an ack line: `len:seq:slot:group`.
    pub fn encode(&self) -> String {
        format!("{}:{}:{}:{}", self.len, self.seq, self.slot, self.group)
    }

    pub fn decode(s: &str) -> Option<BlockInfo> {
        let v: Vec<u64> = s
            .split(':')
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        (v.len() == 4).then(|| BlockInfo {
            len: v[0],
            seq: v[1],
            slot: v[2],
            group: v[3],
        })
    }
}

/// Reads and verifies the block at `off`. `full` checks every pattern word; otherwise
/// a stride of words plus the first and last 64 (cheap for multi-MiB blocks).
pub fn read_block(region: &Region, off: u64, full: bool) -> Result<BlockInfo, String> {
    if !region.contains(off, B_HDR) {
        return Err(format!("block {off:#x} lies outside the heap"));
    }
    let w = |i: u64| -> u64 { region.read::<u64>(off + 8 * i) };
    let info = BlockInfo {
        len: w(0),
        seq: w(1),
        slot: w(2),
        group: w(3),
    };
    if info.len < B_HDR || !info.len.is_multiple_of(8) || !region.contains(off, info.len) {
        return Err(format!("block {off:#x}: bad len in header {info:?}"));
    }
    if w(4) != info.check() {
        return Err(format!("block {off:#x}: header check mismatch {info:?}"));
    }
    let words = (info.len - B_HDR) / 8;
    let base = off + B_HDR;
    let verify = |i: u64| -> Result<(), String> {
        let got: u64 = region.read(base + 8 * i);
        if got != info.word(i) {
            return Err(format!(
                "block {off:#x} {info:?}: pattern word {i} is {got:#x}, expected {:#x}",
                info.word(i)
            ));
        }
        Ok(())
    };
    if full || words <= 8192 {
        for i in 0..words {
            verify(i)?;
        }
    } else {
        for i in (0..64)
            .chain((64..words).step_by(509))
            .chain(words - 64..words)
        {
            verify(i)?;
        }
    }
    Ok(info)
}

/// The table of slots rooted at `heap.root()`.
#[derive(Clone, Copy, Debug)]
pub struct Table {
    pub off: u64,
    pub nslots: usize,
}

impl Table {
    /// Allocates a zeroed table, persists it and publishes it as the root.
    pub fn create(heap: &Heap, th: &mut ThreadHeap, nslots: usize) -> Table {
        let len = T_HDR + 8 * nslots as u64;
        let p = th.alloc_zeroed(len).expect("table alloc");
        let r = heap.region();
        r.write(p.offset(), &TABLE_MAGIC);
        r.write(p.offset() + 8, &(nslots as u64));
        r.persist(p.offset(), len as usize);
        heap.set_root(p).expect("set_root");
        th.end_op();
        Table {
            off: p.offset(),
            nslots,
        }
    }

    /// The table at the root, if there is one.
    pub fn open(heap: &Heap) -> Option<Table> {
        let root = heap.root().offset();
        let r = heap.region();
        if root == 0 || !r.contains(root, T_HDR) || r.read::<u64>(root) != TABLE_MAGIC {
            return None;
        }
        let nslots = r.read::<u64>(root + 8) as usize;
        assert!(
            r.contains(root, T_HDR + 8 * nslots as u64),
            "table larger than the heap"
        );
        Some(Table { off: root, nslots })
    }

    pub fn slot_off(&self, i: usize) -> u64 {
        assert!(i < self.nslots);
        self.off + T_HDR + 8 * i as u64
    }
    pub fn counter_off(&self) -> u64 {
        self.off + 16
    }
    pub fn get(&self, r: &Region, i: usize) -> u64 {
        r.read(self.slot_off(i))
    }
    pub fn counter(&self, r: &Region) -> u64 {
        r.read(self.counter_off())
    }

    /// Every block reachable from the table (the table itself included).
    pub fn reachable(&self, r: &Region) -> HashSet<u64> {
        let mut s = HashSet::new();
        s.insert(self.off);
        for i in 0..self.nslots {
            let p = self.get(r, i);
            if p != 0 {
                s.insert(p);
            }
        }
        s
    }
}

/// The reachability set of a heap holding a table (empty if there is no table).
pub fn reachable_of(heap: &Heap) -> HashSet<u64> {
    Table::open(heap)
        .map(|t| t.reachable(heap.region()))
        .unwrap_or_default()
}

/// Opens a heap read-write, replays, sweeps with the table's reachability.
pub fn open_and_finish(path: &std::path::Path, opts: &HeapOptions) -> Result<Heap, Error> {
    let rec = Heap::open(path, opts)?;
    let reach = reachable_of(rec.heap());
    let (heap, _rep) = rec.finish(|b| reach.contains(&b.offset()))?;
    Ok(heap)
}

/// The logical state of the structure: slot -> block info, and the counter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub slots: BTreeMap<usize, BlockInfo>,
    pub counter: u64,
}

impl State {
    /// Applies a list of effects.
    pub fn apply(&mut self, eff: &Effects) {
        for (slot, b) in &eff.slots {
            match b {
                Some(b) => {
                    self.slots.insert(*slot, *b);
                }
                None => {
                    self.slots.remove(slot);
                }
            }
        }
        if let Some(c) = eff.counter {
            self.counter = c;
        }
    }
}

/// What one operation changes if it takes effect.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    pub slots: Vec<(usize, Option<BlockInfo>)>,
    pub counter: Option<u64>,
}

impl Effects {
    /// `counter slot=len:seq:slot:group|- ...` (`-` for an unchanged counter).
    pub fn encode(&self) -> String {
        let mut s = match self.counter {
            Some(c) => c.to_string(),
            None => "-".to_string(),
        };
        for (slot, b) in &self.slots {
            s.push(' ');
            s.push_str(&format!(
                "{slot}={}",
                b.map(|b| b.encode()).unwrap_or_else(|| "-".into())
            ));
        }
        s
    }

    pub fn decode(words: &[&str]) -> Option<Effects> {
        let (c, rest) = words.split_first()?;
        let counter = if *c == "-" {
            None
        } else {
            Some(c.parse().ok()?)
        };
        let mut slots = Vec::new();
        for w in rest {
            let (s, b) = w.split_once('=')?;
            let b = if b == "-" {
                None
            } else {
                Some(BlockInfo::decode(b)?)
            };
            slots.push((s.parse().ok()?, b));
        }
        Some(Effects { slots, counter })
    }
}

/// Reads the whole structure, verifying every block: allocated, distinct, intact,
/// written for its slot.
pub fn read_state(heap: &Heap, t: &Table, full: bool) -> Result<State, String> {
    let r = heap.region();
    let mut st = State {
        counter: t.counter(r),
        ..Default::default()
    };
    if !heap.is_allocated(PPtr::from_raw(t.off)) {
        return Err(format!("table {:#x} is not allocated", t.off));
    }
    let mut seen = HashSet::new();
    for i in 0..t.nslots {
        let p = t.get(r, i);
        if p == 0 {
            continue;
        }
        if !heap.is_allocated(PPtr::from_raw(p)) {
            return Err(format!("slot {i}: block {p:#x} is not allocated"));
        }
        if !seen.insert(p) {
            return Err(format!(
                "slot {i}: block {p:#x} is shared with another slot"
            ));
        }
        let usable = heap
            .usable_size(PPtr::from_raw(p))
            .map_err(|e| e.to_string())?;
        let b = read_block(r, p, full).map_err(|e| format!("slot {i}: {e}"))?;
        if b.len > usable {
            return Err(format!(
                "slot {i}: block {p:#x} says len {} but is only {usable} bytes",
                b.len
            ));
        }
        if b.group > st.counter {
            return Err(format!(
                "slot {i}: block {p:#x} belongs to multi-slot tx {} but the counter is {}",
                b.group, st.counter
            ));
        }
        if b.slot != i as u64 {
            return Err(format!(
                "slot {i}: block {p:#x} was written for slot {}",
                b.slot
            ));
        }
        st.slots.insert(i, b);
    }
    Ok(st)
}

/// Allocator-level checks: metadata consistent, no logs pending, and exactly the
/// reachable blocks are allocated (no leak, nothing reachable freed).
pub fn check_allocator(heap: &Heap, t: &Table) -> Result<pmem::CheckReport, String> {
    let rep = pmem::check_heap(heap);
    if !rep.ok() {
        return Err(format!("check_heap found problems:\n{rep}"));
    }
    if rep.pending_logs != 0 {
        return Err(format!(
            "{} committed logs pending after open",
            rep.pending_logs
        ));
    }
    let reach = t.reachable(heap.region());
    for &p in &reach {
        if !heap.is_allocated(PPtr::from_raw(p)) {
            return Err(format!("reachable block {p:#x} is free"));
        }
    }
    if rep.blocks != reach.len() as u64 {
        return Err(format!(
            "{} blocks allocated but {} reachable (leak or lost block)\n{rep}",
            rep.blocks,
            reach.len()
        ));
    }
    Ok(rep)
}

// ---- operations on the table (shared by the SIGKILL child and the model test) ----
//
// Each returns the effects it had; on `Err` nothing changed. Every operation ends an
// NV-epoch (`end_op`) and ends with a fence, so a completed operation is durable.

fn write_fresh(heap: &Heap, p: u64, b: &BlockInfo) {
    let r = heap.region();
    r.write_bytes(p, &b.bytes());
    r.persist(p, b.len as usize);
}

/// Non-transactional insert (or replace of an occupied slot): alloc, fill, persist,
/// link, persist; the old block is announced before the unlink and freed after.
pub fn op_insert(
    heap: &Heap,
    th: &mut ThreadHeap,
    t: &Table,
    slot: usize,
    b: BlockInfo,
) -> Result<Effects, Error> {
    let r = heap.region();
    let old = t.get(r, slot);
    let ticket: Option<FreeTicket> = if old != 0 {
        Some(th.prepare_free(PPtr::from_raw(old))?)
    } else {
        None
    };
    let p = match th.alloc(b.len) {
        Ok(p) => p,
        Err(e) => {
            if let Some(tk) = ticket {
                heap.cancel_ticket(tk);
            }
            th.end_op();
            return Err(e);
        }
    };
    write_fresh(heap, p.offset(), &b);
    r.write(t.slot_off(slot), &p.offset());
    r.persist(t.slot_off(slot), 8);
    if let Some(tk) = ticket {
        heap.free_tickets([tk]).expect("free ticket");
    }
    th.end_op();
    Ok(Effects {
        slots: vec![(slot, Some(b))],
        counter: None,
    })
}

/// Non-transactional delete: announce, unlink + persist, free.
pub fn op_delete(
    heap: &Heap,
    th: &mut ThreadHeap,
    t: &Table,
    slot: usize,
) -> Result<Effects, Error> {
    let r = heap.region();
    let old = t.get(r, slot);
    if old != 0 {
        let tk = th.prepare_free(PPtr::from_raw(old))?;
        r.write(t.slot_off(slot), &0u64);
        r.persist(t.slot_off(slot), 8);
        heap.free_tickets([tk]).expect("free ticket");
    }
    th.end_op();
    Ok(Effects {
        slots: vec![(slot, None)],
        counter: None,
    })
}

/// Non-transactional delete of several slots: every block announced, then each
/// unlink persisted, then all freed in one batch. Not atomic: a crash may leave any
/// subset unlinked (the announced blocks are swept).
pub fn op_delete_batch(
    heap: &Heap,
    th: &mut ThreadHeap,
    t: &Table,
    slots: &[usize],
) -> Result<Effects, Error> {
    let r = heap.region();
    let mut tickets = Vec::new();
    for &s in slots {
        let old = t.get(r, s);
        if old != 0 {
            match th.prepare_free(PPtr::from_raw(old)) {
                Ok(tk) => tickets.push(tk),
                Err(e) => {
                    for tk in tickets {
                        heap.cancel_ticket(tk);
                    }
                    th.end_op();
                    return Err(e);
                }
            }
        }
    }
    for &s in slots {
        r.write(t.slot_off(s), &0u64);
        r.persist(t.slot_off(s), 8);
    }
    heap.free_tickets(tickets).expect("free tickets");
    th.end_op();
    Ok(Effects {
        slots: slots.iter().map(|&s| (s, None)).collect(),
        counter: None,
    })
}

/// Transactional replace: tx.alloc, content, tx.write of the slot, tx.free of the old.
pub fn op_tx_replace(
    heap: &Heap,
    th: &mut ThreadHeap,
    t: &Table,
    slot: usize,
    b: BlockInfo,
) -> Result<Effects, Error> {
    let old = t.get(heap.region(), slot);
    let mut tx = th.begin();
    let p = tx.alloc(b.len)?;
    tx.write(p.offset(), &b.bytes())?;
    tx.write_u64(t.slot_off(slot), p.offset())?;
    if old != 0 {
        tx.free(PPtr::from_raw(old))?;
    }
    tx.commit().expect("commit");
    th.end_op();
    Ok(Effects {
        slots: vec![(slot, Some(b))],
        counter: None,
    })
}

/// Transactional in-place rewrite of an occupied slot's block (logged writes, redo
/// replay). `seq` is the new sequence number; the length stays.
pub fn op_tx_update(
    heap: &Heap,
    th: &mut ThreadHeap,
    t: &Table,
    slot: usize,
    seq: u64,
) -> Result<Effects, Error> {
    let p = t.get(heap.region(), slot);
    assert!(p != 0, "update of an empty slot");
    let len: u64 = heap.region().read(p);
    assert!(len <= MAX_INPLACE);
    let b = BlockInfo::new(len, seq, slot, 0);
    let mut tx = th.begin();
    // Two overlapping writes: the later one wins (also on replay).
    tx.write(p, &vec![0xA5u8; len as usize])?;
    let bytes = b.bytes();
    tx.write(p, &bytes[..(len as usize / 2)])?;
    tx.write(p + len / 2, &bytes[(len as usize / 2)..])?;
    let mut back = vec![0u8; len as usize];
    tx.read(p, &mut back)?;
    assert_eq!(back, bytes, "read-your-writes in a transaction");
    tx.commit().expect("commit");
    th.end_op();
    Ok(Effects {
        slots: vec![(slot, Some(b))],
        counter: None,
    })
}

/// One multi-slot transaction: new blocks in every listed slot (all tagged with the
/// new counter value) and the table counter bumped, atomically. The second slot is
/// written in a flat-nested transaction.
pub fn op_tx_multi(
    heap: &Heap,
    th: &mut ThreadHeap,
    t: &Table,
    slots: &[(usize, u64)],
    seq0: u64,
) -> Result<Effects, Error> {
    let r = heap.region();
    let mut tx = th.begin();
    let c = tx.read_u64(t.counter_off())? + 1;
    let mut eff = Effects {
        slots: Vec::new(),
        counter: Some(c),
    };
    for (k, &(slot, len)) in slots.iter().enumerate() {
        let b = BlockInfo::new(len, seq0 + k as u64, slot, c);
        let old = t.get(r, slot);
        let one = |tx: &mut pmem::Tx<'_>| -> Result<(), Error> {
            let p = tx.alloc(b.len)?;
            tx.write(p.offset(), &b.bytes())?;
            tx.write_u64(t.slot_off(slot), p.offset())?;
            if old != 0 {
                tx.free(PPtr::from_raw(old))?;
            }
            Ok(())
        };
        if k == 1 {
            tx.nested(|tx| one(tx))?;
        } else {
            one(&mut tx)?;
        }
        eff.slots.push((slot, Some(b)));
    }
    tx.write_u64(t.counter_off(), c)?;
    tx.commit().expect("commit");
    th.end_op();
    Ok(eff)
}

/// A transaction that allocates, writes, frees and then aborts: no effect.
pub fn op_tx_abort(
    heap: &Heap,
    th: &mut ThreadHeap,
    t: &Table,
    slot: usize,
    b: BlockInfo,
) -> Result<Effects, Error> {
    let old = t.get(heap.region(), slot);
    let mut tx = th.begin();
    let p = tx.alloc(b.len)?;
    tx.write(p.offset(), &b.bytes())?;
    tx.write_u64(t.slot_off(slot), p.offset())?;
    tx.write_u64(t.counter_off(), 0xdead)?;
    if old != 0 {
        tx.free(PPtr::from_raw(old))?;
        tx.write(old, &[0xEEu8; B_HDR as usize])?;
    }
    let q = tx.alloc(64)?;
    tx.free(q)?;
    tx.abort();
    th.end_op();
    Ok(Effects::default())
}
