//! Persistent pointers: offsets from the region base, with spare low bits for marks.

use bytemuck::{Pod, Zeroable};
use std::fmt;
use std::marker::PhantomData;

/// Number of low bits of a persistent pointer free for marks. Every heap block is
/// 16-byte aligned, so the low four bits of a block offset are always zero.
pub const MARK_BITS: u32 = 4;
/// Mask of the mark bits.
pub const MARK_MASK: u64 = (1 << MARK_BITS) - 1;

/// A typed persistent pointer: a byte offset from the region base (0 is null), stored
/// as a little-endian `u64` in the heap. The low [`MARK_BITS`] bits may carry marks
/// (e.g. "link not yet durable", "logically deleted"); `offset()` strips them.
#[repr(transparent)]
pub struct PPtr<T> {
    raw: u64,
    _ty: PhantomData<fn() -> T>,
}

impl<T> PPtr<T> {
    pub const NULL: Self = Self::from_raw(0);

    /// Builds a pointer from its raw stored form (offset plus marks).
    pub const fn from_raw(raw: u64) -> Self {
        Self {
            raw,
            _ty: PhantomData,
        }
    }

    /// The raw stored form: offset with marks.
    pub const fn raw(self) -> u64 {
        self.raw
    }

    /// Byte offset from the region base, marks stripped.
    pub const fn offset(self) -> u64 {
        self.raw & !MARK_MASK
    }

    pub const fn is_null(self) -> bool {
        self.offset() == 0
    }

    /// The mark bits.
    pub const fn marks(self) -> u64 {
        self.raw & MARK_MASK
    }

    /// The same pointer with `bits` set (bits must lie in [`MARK_MASK`]).
    pub const fn with_marks(self, bits: u64) -> Self {
        debug_assert!(bits & !MARK_MASK == 0);
        Self::from_raw(self.raw | (bits & MARK_MASK))
    }

    /// The same pointer with no marks.
    pub const fn unmarked(self) -> Self {
        Self::from_raw(self.offset())
    }

    /// Reinterprets the pointee type.
    pub const fn cast<U>(self) -> PPtr<U> {
        PPtr::from_raw(self.raw)
    }

    /// A pointer `bytes` further on (marks dropped).
    pub const fn add_bytes<U>(self, bytes: u64) -> PPtr<U> {
        PPtr::from_raw(self.offset() + bytes)
    }
}

impl<T> Clone for PPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for PPtr<T> {}
impl<T> PartialEq for PPtr<T> {
    fn eq(&self, o: &Self) -> bool {
        self.raw == o.raw
    }
}
impl<T> Eq for PPtr<T> {}
impl<T> std::hash::Hash for PPtr<T> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.raw.hash(h)
    }
}
impl<T> PartialOrd for PPtr<T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for PPtr<T> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.raw.cmp(&o.raw)
    }
}
impl<T> Default for PPtr<T> {
    fn default() -> Self {
        Self::NULL
    }
}
impl<T> fmt::Debug for PPtr<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.marks() != 0 {
            write!(f, "PPtr({:#x}|{:#x})", self.offset(), self.marks())
        } else {
            write!(f, "PPtr({:#x})", self.offset())
        }
    }
}

// SAFETY: `PPtr<T>` is `repr(transparent)` over a `u64` (PhantomData is a ZST), so it
// has no padding and every bit pattern is a valid value.
unsafe impl<T: 'static> Zeroable for PPtr<T> {}
// SAFETY: as above; it is Copy and contains no references.
unsafe impl<T: 'static> Pod for PPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip() {
        let p: PPtr<u64> = PPtr::from_raw(0x1230);
        assert_eq!(p.offset(), 0x1230);
        let m = p.with_marks(1);
        assert_eq!(m.marks(), 1);
        assert_eq!(m.offset(), 0x1230);
        assert_eq!(m.unmarked(), p);
        assert!(!m.is_null());
        assert!(PPtr::<u8>::NULL.with_marks(3).is_null());
        assert_eq!(bytemuck::bytes_of(&p), &0x1230u64.to_le_bytes());
    }
}
