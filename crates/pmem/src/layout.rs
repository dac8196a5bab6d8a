//! The on-heap format: fixed-width, little-endian. ARCHITECTURE.md gives the same
//! layout byte by byte; keep the two in step.
//!
//! ```text
//! file offset
//! 0            superblock copy A (256 B)
//! 4096         superblock copy B (256 B)
//! 65536        thread slots: nslots x slot_size, each = redo log (log_size B)
//!              followed by the active page table (apt_entries x u64)
//! header_size  chunk 0, chunk 1, ... (chunk_size each; header_size is a multiple of 64 KiB)
//! ```
//!
//! A chunk is `chunk_pages` pages of 64 KiB. Page 0 of a chunk is its header:
//!
//! ```text
//! 0            chunk word: magic "EMCH" << 32 | count << 8 | kind (1 normal, 2 huge head)
//! 64 + 8*p     page descriptor of page p (1 <= p < chunk_pages)
//! 4096 + 512*p allocation bitmap of the slab whose head page is p (4096 bits)
//! ```

use crate::error::{Error, Result};
use std::path::Path;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;

/// Allocator page size.
pub const PAGE: u64 = 64 * KIB;
/// Format version written by this build. Version 2 added block entries to the
/// active page tables (`APT_BLOCK_FLAG`); a version-1 heap is upgraded when it is
/// opened for writing (it has none).
pub const FORMAT_VERSION: u32 = 2;
pub const MAGIC: [u8; 8] = *b"EMBERHP\x01";
/// Bit 1 of an APT entry: the entry covers one slab block (a free ticket's), whose
/// offset is the rest of the entry (blocks are 16-byte aligned).
pub const APT_BLOCK_FLAG: u64 = 2;
/// Bit 2 of an APT entry: the entry covers one bitmap word (64 blocks) of the slab
/// headed at the entry's page; the word index is in bits 3..16.
pub const APT_WORD_FLAG: u64 = 4;
pub const APT_WORD_SHIFT: u32 = 3;
pub const SB_A: u64 = 0;
pub const SB_B: u64 = 4096;
pub const SB_LEN: usize = 256;
pub const SLOTS_BASE: u64 = PAGE;

/// Chunk header fields.
pub const CHUNK_MAGIC: u64 = 0x454d_4348 << 32;
pub const CHUNK_MAGIC_MASK: u64 = 0xffff_ffff << 32;
pub const CHUNK_NORMAL: u64 = 1;
pub const CHUNK_HUGE: u64 = 2;
pub const DESC_BASE: u64 = 64;
pub const BITMAP_BASE: u64 = 4096;
pub const BITMAP_BYTES: u64 = 512;
pub const MAX_CHUNK_PAGES: u64 = 64;
pub const MIN_CHUNK_PAGES: u64 = 16;

/// Page descriptor kinds (low 8 bits of the descriptor).
pub const PD_FREE: u64 = 0;
pub const PD_SLAB: u64 = 1; // class in bits 8..16, pages in bits 16..24
pub const PD_CONT: u64 = 2; // head page index in bits 8..16
pub const PD_RUN: u64 = 3; // pages in bits 16..24

pub fn chunk_word(kind: u64, count: u64) -> u64 {
    CHUNK_MAGIC | (count << 8) | kind
}
pub fn pd_slab(class: usize, pages: u64) -> u64 {
    PD_SLAB | ((class as u64) << 8) | (pages << 16)
}
pub fn pd_cont(head: u64) -> u64 {
    PD_CONT | (head << 8)
}
pub fn pd_run(pages: u64) -> u64 {
    PD_RUN | (pages << 16)
}
pub fn pd_kind(d: u64) -> u64 {
    d & 0xff
}
pub fn pd_class(d: u64) -> usize {
    ((d >> 8) & 0xff) as usize
}
pub fn pd_head(d: u64) -> u64 {
    (d >> 8) & 0xff
}
pub fn pd_pages(d: u64) -> u64 {
    (d >> 16) & 0xff
}

/// Block size classes served from slabs (bytes). Larger blocks are page runs, and
/// blocks larger than a chunk are whole-chunk ("huge") runs.
pub const CLASSES: [u32; 44] = [
    16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024,
    1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 14336,
    16384, 20480, 24576, 28672, 32768, 40960, 49152, 57344, 65536,
];
pub const MAX_SMALL: u64 = 65536;

/// Class of each size in 16-byte steps up to 1 KiB (index: (size + 15) / 16).
const SMALL_CLASS: [u8; 65] = {
    let mut t = [0u8; 65];
    let mut i = 0;
    while i < 65 {
        let size = if i == 0 { 1 } else { i as u32 * 16 };
        let mut c = 0;
        while CLASSES[c] < size {
            c += 1;
        }
        t[i] = c as u8;
        i += 1;
    }
    t
};

/// The class serving `size` bytes, if it is small.
#[inline]
pub fn class_of(size: u64) -> Option<usize> {
    if size <= 1024 {
        return Some(SMALL_CLASS[size.div_ceil(16) as usize] as usize);
    }
    if size > MAX_SMALL {
        return None;
    }
    Some(CLASSES.partition_point(|&c| (c as u64) < size))
}

const fn slab_pages_of(b: u64) -> u64 {
    if b <= 8192 {
        1
    } else {
        (8 * b).div_ceil(PAGE)
    }
}

const SLAB_BLOCKS: [u64; CLASSES.len()] = {
    let mut t = [0u64; CLASSES.len()];
    let mut c = 0;
    while c < CLASSES.len() {
        t[c] = slab_pages_of(CLASSES[c] as u64) * PAGE / CLASSES[c] as u64;
        c += 1;
    }
    t
};

/// Reciprocals for dividing an offset inside a slab (< 2^20) by the block size
/// exactly: q = (n * R) >> 48 with R = ceil(2^48 / b); exact since n * (R*b - 2^48)
/// < 2^20 * 2^16 < 2^48.
const RECIP: [u64; CLASSES.len()] = {
    let mut t = [0u64; CLASSES.len()];
    let mut c = 0;
    while c < CLASSES.len() {
        t[c] = (1u64 << 48).div_ceil(CLASSES[c] as u64);
        c += 1;
    }
    t
};

/// `n / CLASSES[class]` for `n` below 2^20 (an offset inside a slab).
#[inline]
pub fn div_by_class(n: u64, class: usize) -> u64 {
    debug_assert!(n < 1 << 20);
    (n * RECIP[class]) >> 48
}

/// Pages in one slab of `class`: one page up to 8 KiB blocks, else enough for 8 blocks.
#[inline]
pub fn slab_pages(class: usize) -> u64 {
    slab_pages_of(CLASSES[class] as u64)
}

/// Blocks in one slab of `class`.
#[inline]
pub fn slab_blocks(class: usize) -> u64 {
    SLAB_BLOCKS[class]
}

/// Format parameters fixed at creation and recorded in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub chunk_pages: u64,
    pub nslots: u64,
    pub log_size: u64,
    pub apt_entries: u64,
}

impl Default for Geometry {
    fn default() -> Self {
        Self {
            chunk_pages: 64,
            nslots: 64,
            log_size: 64 * KIB,
            // Half may be free tickets' block entries (index::reclaim throttles
            // a thread at 512 outstanding).
            apt_entries: 8192,
        }
    }
}

impl Geometry {
    /// Small geometry for tests and the crash simulator: 1 MiB chunks, 4 slots.
    pub fn small() -> Self {
        Self {
            chunk_pages: 16,
            nslots: 4,
            log_size: 16 * KIB,
            apt_entries: 64,
        }
    }

    pub fn validate(&self) -> std::result::Result<(), String> {
        if !self.chunk_pages.is_power_of_two()
            || !(MIN_CHUNK_PAGES..=MAX_CHUNK_PAGES).contains(&self.chunk_pages)
        {
            return Err(format!(
                "chunk_pages {} must be a power of two in {MIN_CHUNK_PAGES}..={MAX_CHUNK_PAGES}",
                self.chunk_pages
            ));
        }
        if self.nslots == 0 || self.nslots > 1024 {
            return Err(format!("nslots {} must be in 1..=1024", self.nslots));
        }
        if self.log_size < 4 * KIB || self.log_size > 64 * MIB || !self.log_size.is_multiple_of(64)
        {
            return Err(format!(
                "log_size {} must be a multiple of 64 in 4 KiB..=64 MiB",
                self.log_size
            ));
        }
        if self.apt_entries < 8 || self.apt_entries > 65536 {
            return Err(format!(
                "apt_entries {} must be in 8..=65536",
                self.apt_entries
            ));
        }
        Ok(())
    }
    #[inline]
    pub fn chunk_size(&self) -> u64 {
        self.chunk_pages * PAGE
    }
    /// log2 of the chunk size (chunk_pages is a power of two).
    #[inline]
    pub fn chunk_shift(&self) -> u32 {
        (self.chunk_pages * PAGE).trailing_zeros()
    }
    #[inline]
    pub fn slot_size(&self) -> u64 {
        (self.log_size + self.apt_entries * 8 + 63) & !63
    }
    #[inline]
    pub fn header_size(&self) -> u64 {
        // Power-of-two rounding by mask (no division).
        (SLOTS_BASE + self.nslots * self.slot_size() + PAGE - 1) & !(PAGE - 1)
    }
    pub fn log_off(&self, slot: usize) -> u64 {
        SLOTS_BASE + slot as u64 * self.slot_size()
    }
    pub fn apt_off(&self, slot: usize) -> u64 {
        self.log_off(slot) + self.log_size
    }
    #[inline]
    pub fn chunk_off(&self, chunk: u64) -> u64 {
        self.header_size() + (chunk << self.chunk_shift())
    }
    /// Number of whole chunks in a heap of `size` bytes.
    pub fn chunks_in(&self, size: u64) -> u64 {
        size.saturating_sub(self.header_size()) / self.chunk_size()
    }
    /// Smallest heap size holding `chunks` chunks.
    pub fn size_for_chunks(&self, chunks: u64) -> u64 {
        self.header_size() + chunks * self.chunk_size()
    }
    /// Rounds a requested heap size to a whole number of chunks (at least one).
    pub fn round_size(&self, size: u64) -> u64 {
        let chunks = size
            .saturating_sub(self.header_size())
            .div_ceil(self.chunk_size())
            .max(1);
        self.size_for_chunks(chunks)
    }
}

/// The superblock: two copies (A and B); the valid copy with the higher `seq` wins, so a
/// torn superblock write never loses the previous one.
///
/// ```text
/// 0   magic [8]           "EMBERHP\x01"
/// 8   version u32         FORMAT_VERSION
/// 12  sb_len u32          256
/// 16  uuid [16]
/// 32  seq u64             bumped on every superblock write
/// 40  size u64            heap bytes in use (file may be longer)
/// 48  generation u64      bumped at every read-write open (lock generations)
/// 56  root u64            root object offset (0 = none)
/// 64  clean u64           1 after a clean shutdown, 0 while open
/// 72  chunk_pages u64
/// 80  nslots u64
/// 88  log_size u64
/// 96  apt_entries u64
/// 104 created_unix_s u64
/// 112 reserved (zero) up to 248
/// 248 checksum u64        crc32 of bytes 0..248
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub uuid: [u8; 16],
    pub seq: u64,
    pub size: u64,
    pub generation: u64,
    pub root: u64,
    pub clean: bool,
    pub geometry: Geometry,
    pub created: u64,
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

impl Superblock {
    pub fn encode(&self) -> [u8; SB_LEN] {
        let mut b = [0u8; SB_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(SB_LEN as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        let words = [
            self.seq,
            self.size,
            self.generation,
            self.root,
            self.clean as u64,
            self.geometry.chunk_pages,
            self.geometry.nslots,
            self.geometry.log_size,
            self.geometry.apt_entries,
            self.created,
        ];
        for (i, w) in words.iter().enumerate() {
            b[32 + 8 * i..40 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        let crc = crc32fast::hash(&b[..248]) as u64;
        b[248..256].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes one copy. `Ok(None)` means "this copy is not valid" (bad checksum);
    /// errors are reserved for facts about the whole file (foreign magic, newer format).
    pub fn decode(path: &Path, b: &[u8]) -> Result<Option<Superblock>> {
        if b[0..7] != MAGIC[0..7] {
            return Ok(None);
        }
        let crc = get_u64(b, 248);
        if crc32fast::hash(&b[..248]) as u64 != crc {
            return Ok(None);
        }
        let version = get_u32(b, 8);
        if version > FORMAT_VERSION || b[7] > MAGIC[7] {
            return Err(Error::NewerVersion {
                path: path.to_path_buf(),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let sb = Superblock {
            version,
            uuid: b[16..32].try_into().unwrap(),
            seq: get_u64(b, 32),
            size: get_u64(b, 40),
            generation: get_u64(b, 48),
            root: get_u64(b, 56),
            clean: get_u64(b, 64) != 0,
            geometry: Geometry {
                chunk_pages: get_u64(b, 72),
                nslots: get_u64(b, 80),
                log_size: get_u64(b, 88),
                apt_entries: get_u64(b, 96),
            },
            created: get_u64(b, 104),
        };
        if let Err(e) = sb.geometry.validate() {
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                detail: format!("superblock geometry invalid: {e}"),
            });
        }
        if sb.size < sb.geometry.size_for_chunks(1) {
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                detail: format!("superblock size {} is smaller than one chunk", sb.size),
            });
        }
        Ok(Some(sb))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_sizes() {
        assert_eq!(class_of(0), Some(0));
        assert_eq!(class_of(16), Some(0));
        assert_eq!(class_of(17), Some(1));
        assert_eq!(class_of(65536), Some(CLASSES.len() - 1));
        assert_eq!(class_of(65537), None);
        for s in 1..=MAX_SMALL {
            let c = class_of(s).unwrap();
            assert!(CLASSES[c] as u64 >= s);
            assert!(c == 0 || (CLASSES[c - 1] as u64) < s);
        }
        for (c, &size) in CLASSES.iter().enumerate() {
            assert!(slab_blocks(c) >= 1 && slab_blocks(c) <= 4096);
            assert!(slab_pages(c) < MIN_CHUNK_PAGES);
            assert_eq!(size % 16, 0);
        }
    }

    #[test]
    fn division_by_class_is_exact() {
        for (c, &size) in CLASSES.iter().enumerate() {
            let b = size as u64;
            let span = slab_pages(c) * PAGE;
            for n in (0..span)
                .step_by(1)
                .filter(|n| n % 8 == 0 || n % b < 3 || n % b > b - 3)
            {
                assert_eq!(div_by_class(n, c), n / b, "n {n} class {b}");
            }
        }
    }

    // The chunk header's descriptors and bitmaps fit its page (checked at compile time).
    const _: () = assert!(DESC_BASE + 8 * MAX_CHUNK_PAGES <= BITMAP_BASE);
    const _: () = assert!(BITMAP_BASE + BITMAP_BYTES * MAX_CHUNK_PAGES <= PAGE);

    #[test]
    fn superblock_round_trip_and_checksum() {
        let sb = Superblock {
            version: FORMAT_VERSION,
            uuid: [7; 16],
            seq: 3,
            size: Geometry::default().size_for_chunks(2),
            generation: 9,
            root: 0x12340,
            clean: true,
            geometry: Geometry::default(),
            created: 1,
        };
        let p = Path::new("x");
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(p, &b).unwrap(), Some(sb));
        b[60] ^= 1;
        assert_eq!(Superblock::decode(p, &b).unwrap(), None);
    }
}
