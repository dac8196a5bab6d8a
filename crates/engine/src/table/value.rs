//! Keys and values as a node holds them: [`KeyBuf`] (inline or boxed key
//! bytes), the [`TableValue`] bound and the [`Blob`] byte-string value.

use std::mem;

use crossbeam_epoch::{Owned, Pointable};

/// Longest key kept inside its node (longer ones get an allocation of their
/// own): a lookup then reads the hash, the chain link and the key from one
/// place instead of following a pointer to the key.
pub(super) const INLINE_KEY: usize = 30;

/// A node's key: inline up to [`INLINE_KEY`] bytes, else boxed.
#[derive(Clone)]
pub(super) enum KeyBuf {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Boxed(Box<[u8]>),
}

impl KeyBuf {
    pub(super) fn new(key: &[u8]) -> KeyBuf {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0u8; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            KeyBuf::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            KeyBuf::Boxed(key.into())
        }
    }
}

impl std::ops::Deref for KeyBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            KeyBuf::Inline { len, bytes } => &bytes[..*len as usize],
            KeyBuf::Boxed(b) => b,
        }
    }
}

/// What a table can hold as a value: anything epoch-managed that can be
/// copied into a new allocation when its node migrates to a doubled array.
/// Every `Clone` type qualifies; [`Blob`] is the byte-string value the stores
/// use.
pub trait TableValue: Pointable + Send + Sync + 'static {
    fn clone_owned(&self) -> Owned<Self>;
}

impl<T: Clone + Send + Sync + 'static> TableValue for T {
    fn clone_owned(&self) -> Owned<T> {
        Owned::new(self.clone())
    }
}

/// A byte-string value or a tombstone, in one allocation (its length, then a
/// tag byte, then the bytes): a reader goes from the node to the bytes through
/// one pointer, where a `Box<[u8]>` behind the node's atomic pointer would
/// take two.
#[repr(transparent)]
pub struct Blob([u8]);

const BLOB_VALUE: u8 = 1;
const BLOB_TOMB: u8 = 0;
/// The pointer tag of a tombstone blob (see `Blob::tomb` and `Node::tagged`).
pub const TOMB_TAG: usize = 1;
/// The length word before the tag and bytes.
const BLOB_HDR: usize = mem::size_of::<usize>();

impl Blob {
    /// A value.
    pub fn new(bytes: &[u8]) -> Owned<Blob> {
        Owned::init(BlobInit {
            tag: BLOB_VALUE,
            bytes,
        })
    }

    /// A tombstone (a removed key whose removal is not yet in the backend).
    pub fn tomb() -> Owned<Blob> {
        // Tagged too, so that a writer learns whether a key is live from the
        // pointer alone (`Node::tagged`), without reading the value's line.
        Owned::<Blob>::init(BlobInit {
            tag: BLOB_TOMB,
            bytes: &[],
        })
        .with_tag(TOMB_TAG)
    }

    /// `Some` of the bytes, or `None` for a tombstone.
    pub fn new_opt(v: Option<&[u8]>) -> Owned<Blob> {
        match v {
            Some(b) => Blob::new(b),
            None => Blob::tomb(),
        }
    }

    /// The bytes, or `None` for a tombstone.
    #[inline]
    pub fn get(&self) -> Option<&[u8]> {
        match self.0.split_first() {
            Some((&BLOB_VALUE, rest)) => Some(rest),
            _ => None,
        }
    }

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(BLOB_HDR + len, mem::align_of::<usize>())
            .expect("blob layout")
    }
}

/// What [`Blob`]'s `Pointable::init` copies: a tag and the bytes. Only
/// [`Blob::new`], [`Blob::tomb`] and `clone_owned` make one (the fields are
/// private), from a
/// borrowed slice, and hand it to `Owned::init` in the same expression, so the
/// bytes outlive the `init` that copies them. (A lifetime cannot be spelled in
/// `Pointable::Init`, hence the raw pointer, and hence no other constructor:
/// safe code elsewhere could otherwise give `init` a dangling one.)
pub struct BlobInit {
    tag: u8,
    bytes: *const [u8],
}

// The allocation is a `usize` length `n` followed by `n` bytes (the
// tag and the value); `deref` builds a slice of exactly those `n` bytes from
// the allocation's pointer, `drop` frees it with the layout it was made with.
// The `unsafe fn`s' contracts are crossbeam-epoch's (`Pointable`): `deref`,
// `deref_mut` and `drop` take a pointer `init` returned and not yet dropped,
// `deref_mut` and `drop` with no other access to it meanwhile.
impl Pointable for Blob {
    const ALIGN: usize = mem::align_of::<usize>();
    type Init = BlobInit;

    unsafe fn init(BlobInit { tag, bytes }: Self::Init) -> usize {
        // SAFETY: a `BlobInit` is made only in this module, from a slice borrowed for the whole `Owned::init` call that runs this (see
        // `BlobInit`), so `bytes` points to a live, initialised slice.
        let bytes = unsafe { &*bytes };
        let n = 1 + bytes.len();
        let layout = Blob::layout(n);
        // SAFETY: the layout has a non-zero size (the length word).
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `p` is a fresh allocation of `BLOB_HDR + n` bytes, aligned
        // for `usize`.
        unsafe {
            (p as *mut usize).write(n);
            p.add(BLOB_HDR).write(tag);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(BLOB_HDR + 1), bytes.len());
        }
        p as usize
    }

    unsafe fn deref<'a>(ptr: usize) -> &'a Blob {
        // SAFETY: by `Pointable::deref`'s contract `ptr` came from `init` and is
        // not freed for 'a: it starts with the length word `n`, followed by `n`
        // initialised bytes, and nobody mutates them (`deref_mut` needs sole
        // access). `Blob` is `repr(transparent)` over `[u8]`, so the slice
        // pointer casts to a `Blob` pointer with the same length.
        unsafe {
            let n = *(ptr as *const usize);
            let s = std::ptr::slice_from_raw_parts((ptr as *const u8).add(BLOB_HDR), n);
            &*(s as *const Blob)
        }
    }

    unsafe fn deref_mut<'a>(ptr: usize) -> &'a mut Blob {
        // SAFETY: as in `deref`; and by the contract nobody else accesses the
        // allocation for 'a, so the `&mut` is unique.
        unsafe {
            let n = *(ptr as *const usize);
            let s = std::ptr::slice_from_raw_parts_mut((ptr as *mut u8).add(BLOB_HDR), n);
            &mut *(s as *mut Blob)
        }
    }

    unsafe fn drop(ptr: usize) {
        // SAFETY: by the contract `ptr` came from `init`, is dropped once, and
        // nobody else accesses it: its length word is readable, and the layout
        // rebuilt from it is the one `init` allocated with.
        unsafe {
            let n = *(ptr as *const usize);
            std::alloc::dealloc(ptr as *mut u8, Blob::layout(n));
        }
    }
}

impl TableValue for Blob {
    fn clone_owned(&self) -> Owned<Blob> {
        Owned::init(BlobInit {
            tag: self.0[0],
            bytes: &self.0[1..],
        })
    }
}
