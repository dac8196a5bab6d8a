//! Cross-referencing logs (Bullet §2.3–§2.4): a pool of persistent circular logs.
//!
//! ## Layout
//! The Bullet descriptor (the heap's root) holds the pool:
//! ```text
//! 0   u32 tag "EBLT"     4  u32 version      8  u32 nlogs     12 u32 backend kind
//! 16  u64 log size       24 u64 backend descriptor (index root)
//! 32  u64 side table (variants st, lfr; 0 = none)   40 u64 salt (random, per store)
//! 64 + 128*i: log i      +0 u64 base (0 = not allocated yet)   +8 u64 head
//!                        +16 u64 cleared (applied flags below it are all clear)
//!                        +24 u64 generation floor: gen << 40 | (head mod 2^40)
//! ```
//! Version 4; version 3 (no generations: its records carry generation 0, its
//! floors are 0) is read too and upgraded at the first read-write open.
//! Positions are logical byte counts that only grow; a record at position `p` lives
//! at `base + p % size`. The live records of a log are those from `head` up to the
//! tail. The tail is not stored: recovery finds it by reading records from `head`
//! until one does not check (its position stamp, generation or checksum is
//! wrong, see "Generations"), which saves
//! the append a second flush and fence (the paper persists a tail index after each
//! record: three persist barriers, two once `lentry` moved to DRAM; ours takes one).
//!
//! A log's block is its `size`-byte ring followed by its *applied flags*: one
//! bit per 8 bytes of ring (`size / 64` bytes, rounded up to a cache line), the
//! bit of a record's first 8 bytes being that record's flag. Dense flags cost a
//! gleaner one flush per cache line of flags (4 KiB of ring, a few dozen
//! records), where a flag in each record's header cost one flush per record;
//! and under `msync` one written-out page of flags per 256 KiB of ring, where
//! flags in the headers wrote every page of the ring out a second time.
//!
//! A record (Figure 3a), 8-byte aligned:
//! ```text
//! 0  u32 len (whole record, padded to 8)   4  u32 klen
//! 8  u8 opcode (bit 7: OPC_MORE, "the batch goes on"; never on a pad record)
//!    9  u8 gen bits 0-7   10 u8 tail padding (0..=7)   11 u8 gen bits 8-15
//! 12 u32 checksum (CRC-32 of the salt, then the record with the checksum
//!        taken as 0: the generation bytes are covered)
//! 16 u64 pos     (bits 0-55: its own position, so a pointer to a reclaimed
//!                record is detected; bits 56-63: gen bits 16-23)
//! 24 u64 prev    (the key's previous record, in any log; 0 = none)
//! 32 u64 version (per key, increasing; also the backend value's stamp)
//! 40 key bytes, then the payload (value bytes, an i64 for Incr, an edit for Merge)
//! ```
//! A record that would straddle the end of the buffer is preceded by a pad record
//! (opcode [`OPC_PAD`]) filling the rest of the buffer; when fewer than a header's
//! bytes remain, there is no pad record and readers skip the gap ([`Pool::skip_gap`]).
//!
//! ## Generations
//! Positions are reused after a crash: the tail recovery finds is where the
//! next run appends, and a record the crash kept *behind* a lost one (B behind
//! A) is still there, position stamp and checksum valid. A new record that
//! ends exactly where B starts would let the next recovery read on into B, a
//! write from before the first crash, replayed over acknowledged ones. So every
//! record carries the 24-bit generation of the open that wrote it
//! ([`record_gen`] of the heap's open generation, which every read-write open
//! bumps and persists before the store appends anything), and recovery reads
//! on only while generations do not decrease ([`gen_follows`]: serial numbers
//! modulo 2^24, 0 for records written before generations, older than any
//! other). A record written since the first crash is of a later open than B,
//! so B, behind it, is where the log ends.
//!
//! The first record at the head has no predecessor: when a log was drained
//! (head = tail) its head may rest exactly on B. Each log therefore has a
//! *floor*, persisted with the head (same flush, one word naming the head it
//! belongs to, so a crash tearing the two leaves no floor rather than a wrong
//! one): the generation of the record at the head, or, for a drained log,
//! of the open that persisted the head ([`Pool::persist_heads`]); every open
//! persists it again for the recovered heads ([`Pool::persist_floors`]), so
//! a floor is never older than the log's oldest live record. Serial
//! comparison holds while a log's live records and floor span fewer than
//! 2^23 opens.
//!
//! ## Append (the writer holds the key's frontend bucket lock)
//! 1. write the record (and any pad record before it) at the tail with `prev` =
//!    the frontend entry's `lentry` and its checksum;
//! 2. flush its lines, fence (the one persist barrier of a put);
//! 3. publish the new tail in DRAM (gleaners read up to it); 4. (the caller) sets
//!    the frontend `lentry` to the record.
//!
//! Under group commit the fence of step 2 is the commit's. When the records
//! go through the file ([`Pool::stages`]), step 1 stages them in DRAM and step
//! 2 moves to the commit: write the staged run to the file, *then* flush the
//! span written, then fence ([`Pool::committing`]; [`Pool::make_durable_to`]
//! for another thread). A flush before the write would let any fence of the
//! thread in between sync the pages with their old bytes.
//!
//! ## Batches
//! A session's batch of several operations (`BulletSession::apply_batch`) is
//! appended as consecutive records of the one log it holds, contiguous in the
//! ring ([`Pool::reserve`] pads to the buffer's end first when the batch would
//! straddle it, so no pad record falls inside a batch; a batch is at most
//! [`Pool::batch_limit`], half a log, which a drained log can always place).
//! Every record but the batch's last carries [`OPC_MORE`] in its opcode byte,
//! covered by the checksum. The records are written ([`Pool::put_record`])
//! without publishing the tail, and published at once ([`Pool::publish`]:
//! without group commit one fence for the whole batch, then the durable
//! watermark and the tail), so no gleaner reads part of a batch.
//!
//! Recovery (`Pool::find_tails`) ends a log after the last record without
//! the bit: a batch whose last record a crash lost (or tore) is not live,
//! whichever of its records were kept. It was never acknowledged (a batch is
//! acknowledged after its fence or its commit). Under group commit the
//! durable watermark only ever rises to a unit's end (a published tail, a
//! commit's end, or [`Pool::make_durable`]'s end of the unit holding a
//! record), so a gleaner never applies part of a batch that could still be
//! dropped. Old records have the bit clear (nothing to convert), and a build
//! that does not know the bit refuses the opcode at replay rather than
//! misreading the record.
//!
//! ## Reclamation
//! Only the epoch advancer moves `head`: to the first record not yet applied. It
//! first publishes the new head as the *read* boundary (no reader starts on a
//! record below it), waits until every reader that might have started earlier has
//! left (an epoch grace period), then persists `head` and only then lets writers
//! reuse the space ([`LogState::free_to`]).
//!
//! A reused position must start with its flag clear: a record appended there
//! over a stale flag would read as applied after a crash, and be lost. So the
//! advancer ([`Pool::persist_heads`]), moving a head from `h0` to `h1`:
//! 1. writes `head = h1` and `cleared = h0` (every flag below `h0` was cleared
//!    and fenced by the previous advance), flushes, fences;
//! 2. clears the flags of `[h0, h1)`, flushes, fences;
//! 3. only then frees the space (`free_to = h1`).
//!
//! Clearing before the head is durable would be wrong: after a crash the old
//! head's records would read as unapplied, and one whose key was since removed
//! from the backend (by a later record in another log) would be applied again.
//! A crash between 1 and 2 leaves stale flags only in `[cleared, head)`, below
//! the head, where nothing is read; opening the store clears them
//! ([`Pool::clear_stale_flags`]) before any append.
//!
//! The code: `tail.rs` (recovery's tail finding and the generation floors),
//! `commit.rs` (group commit: the durable watermark, commits, staging through
//! the file); this file holds the layout, the pool, appends, reads, the
//! applied flags and the heads.

mod commit;
mod tail;

use crate::{Error, Result};
use commit::Staged;
use pmem::{Heap, PPtr, Region};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub const ROOT_TAG: u32 = u32::from_le_bytes(*b"EBLT");
/// Version 4: records carry their open's generation (see "Generations").
pub const ROOT_VERSION: u32 = 4;
/// The version before generations: its records carry generation 0, read as
/// older than any other. Opened, and upgraded to `ROOT_VERSION` at the first
/// read-write open (`Pool::persist_floors`), before any record is appended.
pub const ROOT_VERSION_NO_GEN: u32 = 3;
pub const SALT_OFF: u64 = 40;
pub const LOGS_OFF: u64 = 64;
pub const LOG_DESC: u64 = 128;
pub const MAX_LOGS: usize = 255;
pub const MIN_LOG_SIZE: u64 = 4096;

pub const REC_HDR: u64 = 40;
/// Offsets in a log's descriptor slot.
const LOG_HEAD: u64 = 8;
const LOG_CLEARED: u64 = 16;
const LOG_FLOOR: u64 = 24;

/// Bits of a record's generation (see "Generations").
pub const GEN_BITS: u32 = 24;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
/// Bits of the head stored with a log's generation floor, to tell whether the
/// floor belongs to the head persisted with it.
const FLOOR_TAG_BITS: u32 = 40;
const FLOOR_TAG_MASK: u64 = (1 << FLOOR_TAG_BITS) - 1;

/// A record generation for the heap's open generation `g`: in `1..2^24`
/// (0 marks records written before generations existed).
pub fn record_gen(g: u64) -> u32 {
    (g.wrapping_sub(1) % GEN_MASK as u64) as u32 + 1
}

/// Whether a record of generation `next` may follow one of generation `prev`
/// in a log (or a log whose floor is `prev` may start with it): generations
/// never decrease along a log. 0 (no generation) precedes every other, and
/// nothing but 0 may precede it; others compare as serial numbers (RFC 1982)
/// modulo 2^24, so `next` is not older when it is less than 2^23 ahead.
pub fn gen_follows(prev: u32, next: u32) -> bool {
    if prev == 0 {
        return true;
    }
    if next == 0 {
        return false;
    }
    next.wrapping_sub(prev) & GEN_MASK < 1 << (GEN_BITS - 1)
}

/// A log's floor word: generation `gen` for head `head`.
fn floor_word(gen: u32, head: u64) -> u64 {
    (gen as u64) << FLOOR_TAG_BITS | (head & FLOOR_TAG_MASK)
}

/// Bytes of applied flags after a ring of `size` bytes: a bit per 8 bytes,
/// whole cache lines.
pub fn flags_len(size: u64) -> u64 {
    (size / 8).div_ceil(512) * 64
}
pub const OPC_PAD: u8 = 0xff;
/// The opcode bit of a batch's records other than its last ("the batch goes
/// on"): recovery ends a log after the last record without it, so a batch a
/// crash cut short is not live (see "Batches"). Never set on a pad record.
/// Records from before batches have it clear, and a build that does not know
/// it refuses the opcode instead of misreading the record.
pub const OPC_MORE: u8 = 0x80;

/// A pointer to a record: `(log + 1) << 56 | pos`; 0 is null.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecPtr(pub u64);

impl RecPtr {
    pub const NULL: RecPtr = RecPtr(0);
    const POS_MASK: u64 = (1 << 56) - 1;

    pub fn new(log: usize, pos: u64) -> RecPtr {
        debug_assert!(log < MAX_LOGS && pos <= Self::POS_MASK);
        RecPtr(((log as u64 + 1) << 56) | pos)
    }
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
    /// The log index (`usize::MAX` for a value that is no record pointer).
    pub fn log(self) -> usize {
        ((self.0 >> 56).wrapping_sub(1)) as usize
    }
    pub fn pos(self) -> u64 {
        self.0 & Self::POS_MASK
    }
}

/// A record's header, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub klen: u32,
    /// The operation (or [`OPC_PAD`]), without the [`OPC_MORE`] bit.
    pub opcode: u8,
    /// A batch's record other than its last ([`OPC_MORE`]).
    pub more: bool,
    pub applied: bool,
    pub pos: u64,
    pub prev: RecPtr,
    pub version: u64,
    /// The generation of the open that wrote it (0: written before
    /// generations existed).
    pub gen: u32,
}

/// Backend kinds recorded in the descriptor.
pub const BACKEND_HASH: u32 = 0;
pub const BACKEND_PHASH: u32 = 1;

/// Volatile state of one log.
#[derive(Debug, Default)]
pub struct LogState {
    /// Offset of the buffer (0 until first used).
    pub base: AtomicU64,
    /// Read boundary: records below it may be reclaimed; never read them.
    pub head: AtomicU64,
    /// Persisted head: writers may reuse space below `free_to + size`.
    pub free_to: AtomicU64,
    /// Published tail: every record below it is complete, and persisted unless
    /// the pool defers fences to a group commit (then up to `durable`).
    pub tail: AtomicU64,
    /// Group commit: every record below this position is durable (a lower
    /// bound; equal to `tail` when fences are not deferred).
    pub durable: AtomicU64,
    /// Group commit: the writer's fence in progress makes the log durable up
    /// to here (see `Pool::committing`).
    pub committing: AtomicU64,
    /// Pages of the buffer up to this position are mapped writable ahead of the
    /// writer (`Pool::populate_ahead`, `Pool::populate_paced`; a hint, never
    /// persisted).
    pub populated: AtomicU64,
    /// Pages of the buffer behind this position were given back to the kernel
    /// (`Pool::release_behind`; a hint, never persisted).
    pub released: AtomicU64,
    /// The tail at the advancer's last `populate_paced` (a hint).
    pub paced: AtomicU64,
    /// Held by a writer.
    pub writer: AtomicBool,
    /// Held by a gleaner.
    pub gleaner: AtomicBool,
    /// The holding gleaner's cursor: the first position it has not finished with.
    pub scan: AtomicU64,
    /// Group commit through the file (`Pool::stages`): the appended bytes not
    /// yet written to the file, one contiguous run.
    staged: std::sync::Mutex<Staged>,
    /// The position of the first staged byte, `u64::MAX` when none is: every
    /// record wholly below it is in the file, and readers read it through the
    /// mapping without taking `staged`.
    staged_from: AtomicU64,
}

/// The persistent log pool of one Bullet store.
pub struct Pool {
    pub heap: Heap,
    pub desc: u64,
    pub size: u64,
    /// Seeds every record checksum: a record of another store (or garbage) never
    /// checks.
    pub salt: u64,
    pub logs: Vec<LogState>,
    /// The generation stamped on every record this pool appends
    /// (`record_gen` of the heap's open generation).
    gen: u32,
    /// Group commit: `append` flushes but does not fence; the writer fences once
    /// per batch ([`Pool::make_durable`] keeps every chain's older records
    /// durable before a newer one can be).
    pub group_commit: AtomicBool,
    /// Whether group commit may write records through the file (`stages`):
    /// not on a read-only region, nor under the crash simulator, which sees
    /// only stores and flushes.
    through_file: bool,
    alloc_lock: std::sync::Mutex<()>,
}

fn pad8(n: u64) -> u64 {
    (n + 7) & !7
}

thread_local! {
    /// A record assembled before it is streamed into a log.
    static RECORD: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The size of a record with `klen` key bytes and `plen` payload bytes.
pub fn record_len(klen: usize, plen: usize) -> u64 {
    pad8(REC_HDR + klen as u64 + plen as u64)
}

impl Pool {
    fn r(&self) -> &Region {
        self.heap.region()
    }
    fn log_field(&self, i: usize, off: u64) -> u64 {
        self.desc + LOGS_OFF + i as u64 * LOG_DESC + off
    }

    /// Writes a new descriptor for `nlogs` logs of `size` bytes in front of the
    /// backend at `backend` and returns its offset (not yet the heap's root).
    pub fn create_desc(
        heap: &Heap,
        nlogs: usize,
        size: u64,
        backend_kind: u32,
        backend: PPtr<u8>,
    ) -> Result<u64> {
        if nlogs == 0 || nlogs > MAX_LOGS {
            return Err(Error::Config(format!("logs must be 1..={MAX_LOGS}")));
        }
        if size < MIN_LOG_SIZE || !size.is_multiple_of(64) {
            return Err(Error::Config(format!(
                "log size must be a multiple of 64 and at least {MIN_LOG_SIZE} bytes"
            )));
        }
        let len = LOGS_OFF + nlogs as u64 * LOG_DESC;
        let mut th = heap.thread()?;
        let p = th.alloc_zeroed(len)?;
        let r = heap.region();
        let d = p.offset();
        r.write(d, &ROOT_TAG);
        r.write(d + 4, &ROOT_VERSION);
        r.write(d + 8, &(nlogs as u32));
        r.write(d + 12, &backend_kind);
        r.write(d + 16, &size);
        r.write(d + 24, &backend.raw());
        r.write(d + SALT_OFF, &random_salt());
        r.persist(d, len as usize);
        Ok(d)
    }

    /// Reads and validates the descriptor at `desc`: returns
    /// `(nlogs, size, backend kind, backend root)`.
    pub fn read_desc(heap: &Heap, desc: u64) -> Result<(usize, u64, u32, PPtr<u8>)> {
        let r = heap.region();
        if desc == 0 || !r.contains(desc, LOGS_OFF) {
            return Err(Error::Corrupt(format!(
                "descriptor {desc:#x} outside the heap"
            )));
        }
        let tag: u32 = r.read(desc);
        if tag != ROOT_TAG {
            return Err(Error::Corrupt(format!(
                "root {desc:#x} is not a Bullet store (tag {tag:#x})"
            )));
        }
        let ver: u32 = r.read(desc + 4);
        if ver != ROOT_VERSION && ver != ROOT_VERSION_NO_GEN {
            return Err(Error::Corrupt(format!(
                "Bullet descriptor version {ver}; this build reads versions \
                 {ROOT_VERSION_NO_GEN} and {ROOT_VERSION}"
            )));
        }
        let nlogs: u32 = r.read(desc + 8);
        let kind: u32 = r.read(desc + 12);
        let size: u64 = r.read(desc + 16);
        let backend: u64 = r.read(desc + 24);
        if nlogs == 0 || nlogs as usize > MAX_LOGS || kind > BACKEND_PHASH {
            return Err(Error::Corrupt(format!(
                "Bullet descriptor: {nlogs} logs, backend kind {kind}"
            )));
        }
        // A log larger than the heap is corrupt (and its size plus its
        // flags' would overflow for a size near 2^64).
        if size < MIN_LOG_SIZE || !size.is_multiple_of(64) || size > r.size() {
            return Err(Error::Corrupt(format!(
                "Bullet descriptor: log size {size}"
            )));
        }
        if !r.contains(desc, LOGS_OFF + nlogs as u64 * LOG_DESC) {
            return Err(Error::Corrupt("Bullet descriptor truncated".into()));
        }
        Ok((nlogs as usize, size, kind, PPtr::from_raw(backend)))
    }

    /// Attaches to the pool of the descriptor at `desc` (validated), loading heads
    /// and tails.
    pub fn attach(heap: &Heap, desc: u64) -> Result<Pool> {
        let (nlogs, size, _, _) = Self::read_desc(heap, desc)?;
        let r = heap.region();
        let salt: u64 = r.read(desc + SALT_OFF);
        let mut logs = Vec::with_capacity(nlogs);
        for i in 0..nlogs {
            let f = desc + LOGS_OFF + i as u64 * LOG_DESC;
            let base: u64 = r.read(f);
            let head: u64 = r.read(f + LOG_HEAD);
            let cleared: u64 = r.read(f + LOG_CLEARED);
            if base != 0 {
                if !size
                    .checked_add(flags_len(size))
                    .is_some_and(|len| r.contains(base, len))
                {
                    return Err(Error::Corrupt(format!("log {i} buffer outside the heap")));
                }
                // Records are read with 8-byte atomics at base + pos (pos a
                // multiple of 8 from the head on): a corrupt offset must be
                // refused here, not panic at the first read.
                if !base.is_multiple_of(8) || !head.is_multiple_of(8) {
                    return Err(Error::Corrupt(format!(
                        "log {i}: buffer at {base:#x}, head {head}: not 8-byte aligned"
                    )));
                }
                if head > RecPtr::POS_MASK / 2 || cleared > head {
                    return Err(Error::Corrupt(format!(
                        "log {i}: head {head}, flags cleared to {cleared}"
                    )));
                }
            } else if head != 0 || cleared != 0 {
                return Err(Error::Corrupt(format!("log {i}: a head without a buffer")));
            }
            logs.push(LogState {
                base: AtomicU64::new(base),
                head: AtomicU64::new(head),
                free_to: AtomicU64::new(head),
                tail: AtomicU64::new(head),
                durable: AtomicU64::new(head),
                committing: AtomicU64::new(head),
                populated: AtomicU64::new(head),
                released: AtomicU64::new(head),
                paced: AtomicU64::new(head),
                writer: AtomicBool::new(false),
                gleaner: AtomicBool::new(false),
                scan: AtomicU64::new(head),
                staged: Default::default(),
                staged_from: AtomicU64::new(u64::MAX),
            });
        }
        let pool = Pool {
            heap: heap.clone(),
            desc,
            size,
            salt,
            logs,
            gen: record_gen(heap.region().generation()),
            group_commit: AtomicBool::new(false),
            through_file: !heap.region().simulated()
                && heap.region().access() == pmem::Access::ReadWrite,
            alloc_lock: std::sync::Mutex::new(()),
        };
        for (i, t) in pool.find_tails() {
            pool.logs[i].tail.store(t, Ordering::Release);
            pool.logs[i].durable.store(t, Ordering::Release);
        }
        Ok(pool)
    }

    /// The heap blocks the pool owns (descriptor and buffers), for the leak sweep.
    pub fn blocks(&self) -> Vec<u64> {
        let mut v = vec![self.desc];
        for l in &self.logs {
            let b = l.base.load(Ordering::Acquire);
            if b != 0 {
                v.push(b);
            }
        }
        v
    }

    /// Allocates log `i`'s buffer if it has none. Crash-safe: the block is in an
    /// active page until its offset is persisted in the descriptor, so a crash in
    /// between leaves a block the leak sweep frees.
    pub fn ensure_buffer(&self, i: usize) -> Result<u64> {
        let b = self.logs[i].base.load(Ordering::Acquire);
        if b != 0 {
            return Ok(b);
        }
        let _g = self.alloc_lock.lock().unwrap_or_else(|e| e.into_inner());
        let b = self.logs[i].base.load(Ordering::Acquire);
        if b != 0 {
            return Ok(b);
        }
        let mut th = self.heap.thread()?;
        // The flags must start clear; the ring's bytes need not (a record is
        // found only where its position stamp and checksum match).
        let p = th.alloc(self.size + flags_len(self.size))?;
        let fl = p.offset() + self.size;
        self.r().fill(fl, flags_len(self.size) as usize, 0);
        self.r().flush(fl, flags_len(self.size) as usize);
        self.r().fence();
        let f = self.log_field(i, 0);
        self.r().write(f, &p.offset());
        self.r().persist(f, 8);
        self.logs[i].base.store(p.offset(), Ordering::Release);
        Ok(p.offset())
    }

    /// Allocates every log's buffer and maps each whole buffer writable, as
    /// databases preallocate their write-ahead log files: the first lap of a new
    /// pool then takes no page faults (on a file: a block reservation and a zeroed
    /// page every 4 KiB, on the writers' path), and a heap too small for its
    /// logs fails now rather than when a writer first needs the last log.
    ///
    /// On an error the buffers this call allocated are freed again (for a pool
    /// not yet reachable from the heap's root: the store's creation).
    pub fn preallocate(&self) -> Result<()> {
        let mut made = Vec::new();
        for i in 0..self.logs.len() {
            let had = self.logs[i].base.load(Ordering::Acquire) != 0;
            if let Err(e) = self.ensure_buffer(i) {
                self.free_buffers(&made);
                return Err(match e {
                    Error::Heap(pmem::Error::HeapFull { .. } | pmem::Error::TooLarge(_)) => {
                        Error::Config(format!(
                            "the heap has no room for {} logs of {} bytes ({e})",
                            self.logs.len(),
                            self.size
                        ))
                    }
                    e => e,
                });
            }
            if !had {
                made.push(i);
            }
        }
        self.populate_ahead(self.size);
        self.write_out(&made);
        Ok(())
    }

    /// Under msync, writes new buffers `which` out to the file once (zeros,
    /// as `populate_ahead` left them), as databases zero-fill a new
    /// write-ahead log file: a heap file is sparse, and the msync that first
    /// writes a block also allocates it, on the writer's path. Under the
    /// other strategies nothing waits for the file, so this does nothing.
    fn write_out(&self, which: &[usize]) {
        let r = self.r();
        if which.is_empty() || r.strategy() != pmem::Strategy::Msync {
            return;
        }
        for &i in which {
            let b = self.logs[i].base.load(Ordering::Acquire);
            if b != 0 {
                r.flush(b, self.size as usize);
            }
        }
        r.fence();
    }

    /// Gives logs `which` back their buffers' space: each descriptor field is
    /// cleared and persisted before its block is freed (the reverse would leave,
    /// for a moment, a descriptor naming a free block). Best effort: a block
    /// that cannot be freed stays allocated and unreachable.
    fn free_buffers(&self, which: &[usize]) {
        let Ok(mut th) = self.heap.thread() else {
            return;
        };
        for &i in which {
            let b = self.logs[i].base.swap(0, Ordering::AcqRel);
            if b == 0 {
                continue;
            }
            let f = self.log_field(i, 0);
            self.r().write(f, &0u64);
            self.r().persist(f, 8);
            let _ = th.free(PPtr::from_raw(b));
        }
    }

    /// Maps the next `ahead` bytes (at most a whole buffer) past each log's tail
    /// writable before its writer gets there, so that an append does not take
    /// the page faults of first touching them (on a file: a fault, a block
    /// reservation and a zeroed page every 4 KiB, about a fifth of a put's time), nor
    /// of re-dirtying pages the kernel wrote back since the last lap. Run by the
    /// epoch advancer, off the write path. Only logs that have a buffer; the
    /// watermark is per lap (positions grow), so every lap is populated again.
    /// Returns the bytes it asked the kernel for.
    pub fn populate_ahead(&self, ahead: u64) -> u64 {
        self.populate_with(|_| ahead)
    }

    /// [`Pool::populate_ahead`] paced by each log's appends: each log gets
    /// four times what was appended to it since the previous call, between
    /// `min` and `max` bytes. An idle log keeps only `min` mapped ahead of its
    /// tail (with `release_behind`, its resident pages stay that few), a busy
    /// one up to `max`.
    pub fn populate_paced(&self, min: u64, max: u64) -> u64 {
        self.populate_with(|l| {
            let tail = l.tail.load(Ordering::Acquire);
            let last = l.paced.swap(tail, Ordering::Relaxed);
            tail.saturating_sub(last)
                .saturating_mul(4)
                .clamp(min, max.max(min))
        })
    }

    /// The buffer's byte runs `(offset, length)` that log positions
    /// `[from, to)` (at most one buffer apart) occupy: one, or two where the
    /// range crosses the end of the ring.
    fn ring_runs(&self, from: u64, to: u64) -> impl Iterator<Item = (u64, u64)> {
        let (a, b) = (from % self.size, to % self.size);
        let runs = if from >= to {
            [None, None]
        } else if a < b || b == 0 {
            let stop = if b == 0 { self.size } else { b };
            [Some((a, stop - a)), None]
        } else {
            [Some((a, self.size - a)), Some((0, b))]
        };
        runs.into_iter().flatten()
    }

    fn populate_with(&self, ahead_of: impl Fn(&LogState) -> u64) -> u64 {
        let r = self.r();
        let stages = self.stages();
        let mut asked = 0;
        for l in &self.logs {
            let base = l.base.load(Ordering::Acquire);
            if base == 0 {
                continue;
            }
            let ahead = ahead_of(l).min(self.size);
            let tail = l.tail.load(Ordering::Acquire);
            let from = l.populated.load(Ordering::Relaxed).max(tail);
            let to = tail + ahead;
            if from >= to {
                continue;
            }
            // Pages written through the file only need to be in memory: mapped
            // writable, their write-back would clean and shoot down a mapping.
            let ok = self.ring_runs(from, to).all(|(off, len)| {
                if stages {
                    r.populate_read(base + off, len)
                } else {
                    r.populate(base + off, len)
                }
            });
            if !ok {
                // Not supported here (or refused): stop asking.
                return asked;
            }
            asked += to - from;
            l.populated.store(to, Ordering::Relaxed);
        }
        asked
    }

    /// Gives the pages of each log's buffer behind its persisted head back to
    /// the kernel (`Region::release`), in runs of at least `min` bytes: their
    /// records are applied and never read again, and the pages are not needed
    /// before the writer comes round to them on the next lap, when
    /// `populate_ahead` maps them again. Without it every page of every buffer
    /// stays in the process's resident set once a lap has touched it (8 logs of
    /// 32 MiB: 256 MiB of RSS for at most the backlog bound of live records).
    /// Pages the next lap already reached (the population watermark, or the
    /// published tail of a writer near a full log) are kept; a page a writer
    /// is filling past its published tail may be given back, which costs it
    /// a page fault and changes no byte. Run by the epoch advancer after
    /// `populate_paced`. Returns the bytes given back.
    pub fn release_behind(&self, min: u64) -> u64 {
        let r = self.r();
        let mut released = 0;
        for l in &self.logs {
            let base = l.base.load(Ordering::Acquire);
            if base == 0 {
                continue;
            }
            // Whole pages only: the page holding the head waits for the next
            // call, when the head has passed it.
            let to = l.free_to.load(Ordering::Acquire) & !4095;
            // Position p's page is next used at p + size: keep it once the
            // writer or the next lap's population has reached that.
            let ahead = l
                .populated
                .load(Ordering::Relaxed)
                .max(l.tail.load(Ordering::Acquire));
            let from = l
                .released
                .load(Ordering::Relaxed)
                .max(ahead.saturating_sub(self.size));
            if to <= from || to - from < min.max(1) {
                continue;
            }
            for (off, len) in self.ring_runs(from, to) {
                r.release(base + off, len);
            }
            released += to - from;
            l.released.store(to, Ordering::Relaxed);
        }
        released
    }

    /// Bytes ever appended across the pool (the sum of the logs' tails, which
    /// only appends move): equal at two instants when nothing was appended
    /// between them.
    pub fn appended_bytes(&self) -> u64 {
        self.logs
            .iter()
            .map(|l| l.tail.load(Ordering::Acquire))
            .sum()
    }

    /// Bytes in use across the pool, and the pool's capacity.
    pub fn occupancy(&self) -> (u64, u64) {
        let mut used = 0;
        for l in &self.logs {
            // `free_to` first: it never passes the tail, which only grows, so
            // a tail read after it is at least as far (the other order could
            // see a head that moved past the tail read before it).
            let free_to = l.free_to.load(Ordering::Acquire);
            used += l.tail.load(Ordering::Acquire) - free_to;
        }
        (used, self.size * self.logs.len() as u64)
    }

    /// Free bytes of log `i` for its writer.
    pub fn free_bytes(&self, i: usize) -> u64 {
        let l = &self.logs[i];
        let free_to = l.free_to.load(Ordering::Acquire);
        self.size - (l.tail.load(Ordering::Acquire) - free_to)
    }

    /// Appends a record to log `i` (the caller holds it as writer) and returns where.
    /// `None` when the log has no room for it now.
    #[inline]
    pub fn append(
        &self,
        i: usize,
        opcode: u8,
        key: &[u8],
        payload: &[u8],
        prev: RecPtr,
        version: u64,
    ) -> Result<Option<RecPtr>> {
        let len = record_len(key.len(), payload.len());
        let Some(mut pos) = self.reserve(i, len)? else {
            return Ok(None);
        };
        let rec = self.put_record(i, &mut pos, opcode, false, key, payload, prev, version)?;
        self.publish(i, pos);
        Ok(Some(rec))
    }

    /// The largest batch of records (`total` bytes, [`record_len`] each) that
    /// [`Pool::reserve`] can always place in one log leaving `keep` bytes free:
    /// a batch is contiguous in the ring, so a log whose tail is too near the
    /// buffer's end pads to it first, and half of what is left after `keep`
    /// always fits before the end or after the pad.
    pub fn batch_limit(&self, keep: u64) -> u64 {
        (self.size.saturating_sub(keep) / 2) & !7
    }

    /// Makes room at log `i`'s tail for `len` contiguous bytes (one record, or
    /// a batch of records: see [`Pool::put_record`]): writes the pad record
    /// when they would straddle the end of the buffer, and returns the position
    /// of the first byte. Publishes nothing. `None` when the log has no room.
    #[inline]
    pub fn reserve(&self, i: usize, len: u64) -> Result<Option<u64>> {
        if len > self.size {
            return Err(Error::RecordTooLarge(len, self.size));
        }
        let l = &self.logs[i];
        let base = self.ensure_buffer(i)?;
        let tail = l.tail.load(Ordering::Relaxed);
        let free_to = l.free_to.load(Ordering::Acquire);
        let phys = tail % self.size;
        let pad = if phys + len > self.size {
            self.size - phys
        } else {
            0
        };
        if tail + pad + len - free_to > self.size {
            return Ok(None);
        }
        if pad >= REC_HDR {
            let mut hdr = [0u8; REC_HDR as usize];
            hdr[0..4].copy_from_slice(&(pad as u32).to_le_bytes());
            hdr[8] = OPC_PAD;
            hdr[16..24].copy_from_slice(&tail.to_le_bytes());
            put_gen(&mut hdr, self.gen);
            // A pad record's checksum covers its header only (`len` = the gap).
            let c = crc_parts(self.salt, &mut hdr, &[], &[]);
            hdr[12..16].copy_from_slice(&c.to_le_bytes());
            if self.stages() {
                // Flushed by the commit, after it writes the run (`committing`).
                self.stage(i, tail, base + phys, &[&hdr], 0, false)?;
            } else {
                self.r().write_bytes(base + phys, &hdr);
                self.r().flush(base + phys, REC_HDR as usize);
            }
        }
        // A gap too small for a header is skipped by readers (`skip_gap`).
        Ok(Some(tail + pad))
    }

    /// Writes a record at position `*pos` of log `i` (room made by
    /// [`Pool::reserve`]) and moves `*pos` past it; returns where it is. It is
    /// not published (see [`Pool::publish`]), and without group commit not
    /// fenced either. `more`: a record of a batch other than its last (the
    /// opcode's [`OPC_MORE`] bit): recovery takes a batch whole or not at all.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn put_record(
        &self,
        i: usize,
        pos: &mut u64,
        opcode: u8,
        more: bool,
        key: &[u8],
        payload: &[u8],
        prev: RecPtr,
        version: u64,
    ) -> Result<RecPtr> {
        let len = record_len(key.len(), payload.len());
        let tail = *pos;
        let r = self.r();
        let base = self.logs[i].base.load(Ordering::Acquire);
        let at = base + tail % self.size;
        let padb = (len - REC_HDR - key.len() as u64 - payload.len() as u64) as u8;
        let mut hdr = [0u8; REC_HDR as usize];
        hdr[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        hdr[4..8].copy_from_slice(&(key.len() as u32).to_le_bytes());
        hdr[8] = if more { opcode | OPC_MORE } else { opcode };
        hdr[10] = padb;
        hdr[16..24].copy_from_slice(&tail.to_le_bytes());
        hdr[24..32].copy_from_slice(&prev.0.to_le_bytes());
        hdr[32..40].copy_from_slice(&version.to_le_bytes());
        put_gen(&mut hdr, self.gen);
        let staged = self.stages();
        if !staged {
            let c = crc_parts(self.salt, &mut hdr, key, payload);
            hdr[12..16].copy_from_slice(&c.to_le_bytes());
        }
        if staged {
            // Written to the file at the commit (`committing`); until then
            // readers find it staged, and any thread can write it out
            // (`make_durable_to`). Its checksum is computed on the staged
            // copy, in one pass. Not flushed here: under msync a flush only
            // queues the pages for the thread's next fence, and a fence
            // before the commit's write (another log's `make_durable`, a log
            // hand-over, a backend read settling a link) would sync them
            // still holding their old bytes. Whoever writes the run to the
            // file flushes what it wrote, after the write (`committing`,
            // `make_durable_to`).
            self.stage(i, tail, at, &[&hdr, key, payload], padb as usize, true)?;
        } else if self.group_commit.load(Ordering::Relaxed) {
            // Other writers may flush this record for a later one of its chain
            // (`make_durable`) before this thread fences: plain stores, which
            // they see at once.
            r.write_bytes(at, &hdr);
            r.write_bytes(at + REC_HDR, key);
            r.write_bytes(at + REC_HDR + key.len() as u64, payload);
            if padb > 0 {
                r.fill(at + len - padb as u64, padb as usize, 0);
            }
            r.flush(at, len as usize);
        } else {
            // The record is written once and read again only by a gleaner, much
            // later: streamed (non-temporal stores where the strategy writes
            // lines back), so the append does not first read its lines into the
            // cache. The fence of `publish` makes it durable and visible before
            // the tail or any frontend entry points at it.
            RECORD.with(|b| {
                let mut b = b.borrow_mut();
                b.clear();
                b.extend_from_slice(&hdr);
                b.extend_from_slice(key);
                b.extend_from_slice(payload);
                b.resize(len as usize, 0);
                r.write_stream(at, &b);
            });
        }
        *pos = tail + len;
        Ok(RecPtr::new(i, tail))
    }

    /// Publishes log `i`'s records up to `end` (the position after the last
    /// record [`Pool::put_record`] wrote): without group commit, one **fence**
    /// for all of them, then the durable watermark; then the tail, which
    /// gleaners read up to. A batch is published whole, so no gleaner applies
    /// part of one.
    #[inline]
    pub fn publish(&self, i: usize, end: u64) {
        let l = &self.logs[i];
        if !self.group_commit.load(Ordering::Relaxed) {
            self.r().fence();
            l.durable.store(end, Ordering::Release);
        }
        l.tail.store(end, Ordering::Release);
    }

    /// Where the record at or after `pos` starts: a position with fewer than a
    /// header's bytes before the end of the buffer holds nothing.
    pub fn skip_gap(&self, pos: u64) -> u64 {
        let room = self.size - pos % self.size;
        if room < REC_HDR {
            pos + room
        } else {
            pos
        }
    }

    /// Whether `p` is below its log's read boundary (reclaimed or about to be: it
    /// was applied).
    pub fn reclaimed(&self, p: RecPtr) -> bool {
        p.log() >= self.logs.len() || p.pos() < self.logs[p.log()].head.load(Ordering::Acquire)
    }

    fn at(&self, p: RecPtr) -> u64 {
        self.logs[p.log()].base.load(Ordering::Acquire) + p.pos() % self.size
    }

    /// Reads the header of the record at `p`, validating it; the caller is inside a
    /// reader epoch (or alone) and `p` is not reclaimed.
    pub fn header(&self, p: RecPtr) -> Result<Header> {
        if p.log() >= self.logs.len() || self.logs[p.log()].base.load(Ordering::Acquire) == 0 {
            return Err(Error::Corrupt(format!("record pointer {:#x}", p.0)));
        }
        if self.size - p.pos() % self.size < REC_HDR {
            return Err(Error::Corrupt(format!(
                "record pointer {:#x} into a log's end gap",
                p.0
            )));
        }
        let r = self.r();
        let mut hb = [0u8; REC_HDR as usize];
        let (len, klen, b, pos, prev, version) = if self.read_staged(p, 0, &mut hb) {
            let w = |a: usize| u64::from_le_bytes(hb[a..a + 8].try_into().expect("8 bytes"));
            let (lk, b) = (w(0), w(8).to_le_bytes());
            (lk as u32, (lk >> 32) as u32, b, w(16), w(24), w(32))
        } else {
            let at = self.at(p);
            (
                r.read::<u32>(at),
                r.read::<u32>(at + 4),
                r.atomic_u64(at + 8).load(Ordering::Acquire).to_le_bytes(),
                r.read::<u64>(at + 16),
                r.read::<u64>(at + 24),
                r.read::<u64>(at + 32),
            )
        };
        let (w, bit) = self.flag_bit(p);
        let flagged = r.atomic_u64(w).load(Ordering::Acquire) & bit != 0;
        let h = Header {
            len,
            klen,
            opcode: if b[0] == OPC_PAD {
                b[0]
            } else {
                b[0] & !OPC_MORE
            },
            more: b[0] != OPC_PAD && b[0] & OPC_MORE != 0,
            applied: flagged || b[0] == OPC_PAD,
            pos: pos & RecPtr::POS_MASK,
            prev: RecPtr(prev),
            version,
            gen: b[1] as u32 | (b[3] as u32) << 8 | ((pos >> 56) as u32) << 16,
        };
        let room = self.size - p.pos() % self.size;
        if h.pos != p.pos()
            || (len as u64) < REC_HDR
            || !len.is_multiple_of(8)
            || len as u64 > room
            || (h.opcode != OPC_PAD && REC_HDR + klen as u64 > len as u64)
        {
            return Err(Error::Corrupt(format!(
                "log {} record at {}: {h:?}",
                p.log(),
                p.pos()
            )));
        }
        Ok(h)
    }

    /// Copies the key of the record at `p` into `key`.
    pub fn key(&self, p: RecPtr, h: &Header, key: &mut Vec<u8>) {
        key.resize(h.klen as usize, 0);
        self.read_record(p, REC_HDR, key);
    }

    /// Copies the payload of the record at `p` into `payload`.
    pub fn payload(&self, p: RecPtr, h: &Header, payload: &mut Vec<u8>) {
        let plen = self.payload_len(p, h);
        payload.resize(plen, 0);
        self.read_record(p, REC_HDR + h.klen as u64, payload);
    }

    fn payload_len(&self, p: RecPtr, h: &Header) -> usize {
        let mut padb = [0u8; 1];
        self.read_record(p, 10, &mut padb);
        (h.len as u64 - REC_HDR - h.klen as u64).saturating_sub(padb[0] as u64) as usize
    }

    /// The word holding the applied flag of the record at `p`, and its bit.
    fn flag_bit(&self, p: RecPtr) -> (u64, u64) {
        let base = self.logs[p.log()].base.load(Ordering::Acquire);
        let slot = (p.pos() % self.size) / 8;
        (base + self.size + slot / 64 * 8, 1 << (slot % 64))
    }

    /// Sets the records' applied flags and flushes their lines, each once (no
    /// fence: the gleaner fences once per batch, before it leaves its epoch).
    /// Every flag is set before any line is flushed. On x86 a locked
    /// instruction waits for the thread's earlier write-backs, so setting and
    /// flushing in turn would wait for each flush in sequence; this way the
    /// write-backs overlap, and the caller's fence waits once.
    pub fn mark_applied_all(&self, ps: &[RecPtr]) {
        let r = self.r();
        let mut lines = Vec::with_capacity(ps.len() / 8 + 1);
        for &p in ps {
            let (w, bit) = self.flag_bit(p);
            r.atomic_u64(w).fetch_or(bit, Ordering::Release);
            lines.push(w & !63);
        }
        lines.sort_unstable();
        lines.dedup();
        for l in lines {
            r.flush(l, 64);
        }
    }

    /// Clears the applied flags of log `i`'s positions `[from, to)` (at most a
    /// ring) and flushes them; no fence. Words shared with live positions are
    /// cleared bit by bit, atomically (a gleaner may be flagging a neighbour).
    fn clear_flags(&self, i: usize, from: u64, to: u64) {
        debug_assert!(from <= to && to - from <= self.size);
        // Record positions are 8-aligned, so whole slots.
        debug_assert!(from.is_multiple_of(8) && to.is_multiple_of(8));
        if from >= to {
            return;
        }
        let (a, b) = (from % self.size, to % self.size);
        if a < b {
            self.clear_slots(i, a / 8, b.div_ceil(8));
        } else {
            self.clear_slots(i, a / 8, self.size.div_ceil(8));
            self.clear_slots(i, 0, b.div_ceil(8));
        }
    }

    /// Clears flag bits `[s, e)` of log `i` (ring offsets / 8) and flushes them.
    fn clear_slots(&self, i: usize, s: u64, e: u64) {
        if s >= e {
            return;
        }
        let r = self.r();
        let flags = self.logs[i].base.load(Ordering::Acquire) + self.size;
        let mut k = s;
        while k < e {
            let w = k / 64;
            let lo = k % 64;
            let hi = (e - w * 64).min(64);
            let mask = if hi - lo == 64 {
                !0
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            let a = r.atomic_u64(flags + w * 8);
            if a.load(Ordering::Relaxed) & mask != 0 {
                a.fetch_and(!mask, Ordering::Release);
            }
            k = w * 64 + hi;
        }
        let (first, last) = (flags + s / 64 * 8, flags + (e - 1) / 64 * 8);
        r.flush(first & !63, ((last & !63) - (first & !63) + 64) as usize);
    }

    /// Opening a store, before any append: clears the flags a crash may have
    /// left set below each log's head (between the head's persist and the
    /// flags' clearing, see "Reclamation"), flushes and fences them.
    pub fn clear_stale_flags(&self) {
        for (i, l) in self.logs.iter().enumerate() {
            if l.base.load(Ordering::Acquire) == 0 {
                continue;
            }
            let cleared: u64 = self.r().read(self.log_field(i, LOG_CLEARED));
            let head = l.head.load(Ordering::Acquire);
            let tail = l.tail.load(Ordering::Acquire);
            // Never into the live records: writers may wrap past `cleared +
            // size` before the next advance moves `cleared` (it lags a head).
            let from = cleared.max(tail.saturating_sub(self.size));
            if from < head {
                self.clear_flags(i, from, head);
            }
        }
        self.r().fence();
    }

    /// Starts fetching the `lines` cache lines from the record at `p` on
    /// (a gleaner reading a log in order; only a hint).
    pub fn prefetch(&self, p: RecPtr, lines: u64) {
        let base = self.logs[p.log()].base.load(Ordering::Acquire);
        if base == 0 {
            return;
        }
        let r = self.r();
        for k in 0..lines {
            let at = base + (p.pos() + k * 64) % self.size;
            r.prefetch(at);
        }
    }

    /// Starts fetching the header of the record at `p` into the cache (a chain
    /// walk's next step); nothing for a null or out-of-range pointer.
    #[inline]
    pub fn prefetch_header(&self, p: RecPtr) {
        if !p.is_null() && p.log() < self.logs.len() {
            self.prefetch(p, 1 + u64::from(p.pos() % 64 > 64 - REC_HDR));
            self.prefetch_flag(p);
        }
    }

    /// Starts fetching the line holding the applied flag of the record at `p`
    /// (`header` reads it, and the flags lie apart from the records: in a
    /// chain walk a demand miss on it held up each step).
    #[inline]
    fn prefetch_flag(&self, p: RecPtr) {
        if p.log() < self.logs.len() && self.logs[p.log()].base.load(Ordering::Acquire) != 0 {
            self.r().prefetch(self.flag_bit(p).0);
        }
    }

    /// Whether log `i`'s writer can append `len` bytes now (counting the pad
    /// record a wrap would need). Also asked of a log another writer may hold
    /// (a hint then): `free_to` is read first, as in `occupancy`.
    pub fn fits(&self, i: usize, len: u64) -> bool {
        self.fits_keeping(i, len, 0)
    }

    /// Whether log `i` has room for a record of `len` bytes and `keep` bytes
    /// more after it (puts keep a share of each log for removes).
    pub fn fits_keeping(&self, i: usize, len: u64, keep: u64) -> bool {
        self.fits_within(i, len, keep, u64::MAX)
    }

    /// [`Pool::fits_keeping`], and the record keeps log `i`'s bytes between
    /// its freed head and its tail within `share` (a bound on what recovery
    /// reads), unless the log holds none: a record larger than a share goes
    /// into an empty log.
    pub fn fits_within(&self, i: usize, len: u64, keep: u64, share: u64) -> bool {
        let l = &self.logs[i];
        let free_to = l.free_to.load(Ordering::Acquire);
        let tail = l.tail.load(Ordering::Acquire);
        let phys = tail % self.size;
        let pad = if phys + len > self.size {
            self.size - phys
        } else {
            0
        };
        let used = tail - free_to;
        used + pad + len + keep <= self.size && (used == 0 || used + pad + len <= share)
    }

    pub fn fence(&self) {
        self.r().fence();
    }

    /// Persists new heads `(log, head)` (the advancer, after the grace period),
    /// clears the applied flags of the positions they free, and then frees
    /// them to writers (`free_to`): steps 1–3 of "Reclamation", two fences for
    /// all logs. Records below a head are never read again, so a stale
    /// checksum-valid record there cannot be mistaken for a live one.
    /// One thread at a time (the advancer's lock).
    pub fn persist_heads(&self, moved: &[(usize, u64)]) {
        let r = self.r();
        let olds: Vec<u64> = moved
            .iter()
            .map(|&(i, _)| self.logs[i].free_to.load(Ordering::Acquire))
            .collect();
        for (&(i, head), &old) in moved.iter().zip(&olds) {
            let f = self.log_field(i, 0);
            // The floor word names the head it is for: torn from the head
            // by a crash, it is ignored (no floor), never applied to
            // another head's records.
            r.write(f + LOG_FLOOR, &floor_word(self.floor_for(i, head), head));
            r.write(f + LOG_HEAD, &head);
            r.write(f + LOG_CLEARED, &old);
            r.flush(f + LOG_HEAD, 24);
        }
        r.fence();
        for (&(i, head), &old) in moved.iter().zip(&olds) {
            self.clear_flags(i, old, head);
        }
        r.fence();
        for &(i, head) in moved {
            self.logs[i].free_to.store(head, Ordering::Release);
        }
    }
}

/// The checksum of a record given as one buffer (header, key, payload, padding),
/// with the checksum field taken as 0.
fn crc(salt: u64, rec: &mut [u8]) -> u32 {
    let (hdr, rest) = rec.split_at_mut(REC_HDR as usize);
    let hdr: &mut [u8; REC_HDR as usize] = hdr.try_into().expect("header size");
    let len = u32::from_le_bytes(hdr[0..4].try_into().expect("4 bytes")) as usize;
    if hdr[8] == OPC_PAD {
        return crc_parts(salt, hdr, &[], &[]);
    }
    let padb = hdr[10] as usize;
    let body = (len - REC_HDR as usize)
        .saturating_sub(padb)
        .min(rest.len());
    crc_parts(salt, hdr, &rest[..body], &[])
}

/// The checksum of header `hdr` followed by `a` and `b` (the checksum field
/// zeroed in `hdr` while hashing, then restored). It covers the generation
/// bytes: a record of one open never checks as another open's. (Records
/// from before generations have zeros there, and checked the same way.)
fn crc_parts(salt: u64, hdr: &mut [u8; REC_HDR as usize], a: &[u8], b: &[u8]) -> u32 {
    let saved_crc: [u8; 4] = hdr[12..16].try_into().expect("4 bytes");
    hdr[12..16].fill(0);
    let mut h = crc32fast::Hasher::new();
    h.update(&salt.to_le_bytes());
    h.update(hdr);
    h.update(a);
    h.update(b);
    hdr[12..16].copy_from_slice(&saved_crc);
    h.finalize()
}

/// Stores generation `gen` in a record header: bits 0-7 in byte 9, 8-15 in
/// byte 11, 16-23 in the top byte of the position field (byte 23).
fn put_gen(hdr: &mut [u8; REC_HDR as usize], gen: u32) {
    debug_assert!(gen <= GEN_MASK);
    hdr[9] = gen as u8;
    hdr[11] = (gen >> 8) as u8;
    hdr[23] = (gen >> 16) as u8;
}

/// A random salt for a new store's checksums.
fn random_salt() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() | 1
}

#[cfg(test)]
mod flag_tests {
    use super::*;

    fn pool(dir: &std::path::Path, size: u64) -> (Heap, Pool) {
        let heap = Heap::create(&dir.join("h"), &crate::test_heap_opts(8 << 20, 8 << 20)).unwrap();
        let desc = Pool::create_desc(&heap, 1, size, BACKEND_HASH, PPtr::from_raw(0)).unwrap();
        let pool = Pool::attach(&heap, desc).unwrap();
        pool.ensure_buffer(0).unwrap();
        (heap, pool)
    }

    fn flagged(pool: &Pool, pos: u64) -> bool {
        let (w, bit) = pool.flag_bit(RecPtr::new(0, pos));
        pool.r().atomic_u64(w).load(Ordering::Acquire) & bit != 0
    }

    /// Clearing a range clears exactly its positions, in partial words at both
    /// ends and around the ring's end, and leaves neighbours' flags set.
    #[test]
    fn clearing_a_range_keeps_the_neighbours_flags() {
        let dir = tempfile::tempdir().unwrap();
        let size = 8192;
        let (_heap, pool) = pool(dir.path(), size);
        assert_eq!(flags_len(size), 128);
        let all: Vec<RecPtr> = (0..size / 8).map(|s| RecPtr::new(0, s * 8)).collect();
        // (from, to) in logical positions; the second wraps around the ring
        // (lap 3), the third is a whole ring.
        for (from, to) in [
            (8 * 5, 8 * 200),
            (3 * size + 8 * 1000, 4 * size + 8 * 70),
            (size, 2 * size),
        ] {
            pool.mark_applied_all(&all);
            pool.clear_flags(0, from, to);
            for p in 0..size / 8 {
                let phys = p * 8;
                let inside = (from..to).any(|q| q % size == phys);
                assert_eq!(
                    flagged(&pool, phys),
                    !inside,
                    "range {from}..{to}: position {phys}"
                );
            }
        }
    }

    /// Writers may wrap past the last advance's `cleared + size` before the
    /// next advance: reopening then clears stale flags only below the head and
    /// never those of live records that share their ring positions with the
    /// range `[cleared, head)`.
    #[test]
    fn stale_flag_clearing_spares_wrapped_live_records() {
        let dir = tempfile::tempdir().unwrap();
        let size = 4096;
        let (_heap, pool) = pool(dir.path(), size);
        let mut first = Vec::new();
        while pool.fits(0, 200) {
            first.push(
                pool.append(0, 1, b"k", &[1; 100], RecPtr::NULL, 1)
                    .unwrap()
                    .unwrap(),
            );
        }
        pool.mark_applied_all(&first);
        let t1 = pool.logs[0].tail.load(Ordering::Acquire);
        // The advance: read boundary, then head and `cleared` (= 0) persisted.
        pool.logs[0].head.store(t1, Ordering::Release);
        pool.persist_heads(&[(0, t1)]);
        // Around the ring, over positions below t1 (below `cleared + size`).
        let mut second = Vec::new();
        while pool.fits(0, 200) {
            second.push(
                pool.append(0, 1, b"k", &[2; 100], RecPtr::NULL, 2)
                    .unwrap()
                    .unwrap(),
            );
        }
        let t2 = pool.logs[0].tail.load(Ordering::Acquire);
        assert!(t2 > size, "the second lap wrapped");
        assert!(second.iter().any(|p| p.pos() % size < t1 % size));
        pool.mark_applied_all(&second);
        pool.clear_stale_flags();
        for p in &second {
            assert!(
                pool.header(*p).unwrap().applied,
                "live record at {} lost its flag",
                p.pos()
            );
        }
    }

    /// A descriptor whose log buffer offset or head is not 8-byte aligned is
    /// refused as corrupt (records are read with 8-byte atomics; `ember
    /// check` panicked on such a heap, found by the `heap` fuzz target).
    #[test]
    fn unaligned_log_buffer_or_head_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let (heap, pool) = pool(dir.path(), 4096);
        let f = pool.desc + LOGS_OFF;
        let base: u64 = heap.region().read(f);
        for (off, v) in [(f, base + 2), (f + LOG_HEAD, 4)] {
            let old: u64 = heap.region().read(off);
            heap.region().write(off, &v);
            match Pool::attach(&heap, pool.desc) {
                Err(Error::Corrupt(m)) => assert!(m.contains("aligned"), "{m}"),
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("attached with {v:#x} at {off:#x}"),
            }
            heap.region().write(off, &old);
        }
        assert!(Pool::attach(&heap, pool.desc).is_ok());
    }

    /// A descriptor whose log size is larger than the heap (near 2^64, its
    /// size plus its flags' overflowed: `ember check` panicked, found by the
    /// `heap` fuzz target) is refused as corrupt.
    #[test]
    fn a_log_size_beyond_the_heap_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let (heap, pool) = pool(dir.path(), 4096);
        let off = pool.desc + 16;
        let old: u64 = heap.region().read(off);
        for v in [u64::MAX - 63, 1u64 << 62, heap.region().size() + 64] {
            heap.region().write(off, &v);
            match Pool::attach(&heap, pool.desc) {
                Err(Error::Corrupt(m)) => assert!(m.contains("log size"), "{m}"),
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("attached with log size {v:#x}"),
            }
        }
        heap.region().write(off, &old);
        assert!(Pool::attach(&heap, pool.desc).is_ok());
    }

    /// A header reads `applied` from the flags; a pad record always reads as
    /// applied.
    #[test]
    fn headers_read_the_flag_bits() {
        let dir = tempfile::tempdir().unwrap();
        let (_heap, pool) = pool(dir.path(), 4096);
        let a = pool
            .append(0, 1, b"k", b"v", RecPtr::NULL, 1)
            .unwrap()
            .unwrap();
        let b = pool.append(0, 1, b"k", b"w", a, 2).unwrap().unwrap();
        assert!(!pool.header(a).unwrap().applied);
        pool.mark_applied_all(&[a]);
        assert!(pool.header(a).unwrap().applied);
        assert!(!pool.header(b).unwrap().applied);
        // Fill to the ring's end: the next record needs a pad record first.
        let mut last = b;
        while pool.fits(0, 2048) {
            last = pool
                .append(0, 1, b"k", &[7; 100], last, 3)
                .unwrap()
                .unwrap();
        }
        let t = pool.logs[0].tail.load(Ordering::Acquire);
        pool.persist_heads(&[(0, t)]);
        let c = pool
            .append(0, 1, b"k", &[7; 2000], last, 4)
            .unwrap()
            .unwrap();
        assert_eq!(c.pos() % 4096, 0, "wrapped after a pad");
        let pad = pool.header(RecPtr::new(0, t)).unwrap();
        assert_eq!(pad.opcode, OPC_PAD);
        assert!(pad.applied);
        assert!(
            !pool.header(c).unwrap().applied,
            "a reused position's flag is clear"
        );
    }
}
