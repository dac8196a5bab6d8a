//! The volatile ownership protocol of a slab, lock-free, shared by the allocator and
//! its loom model (`tests/loom_slab.rs`, run with `RUSTFLAGS="--cfg loom"`).
//!
//! A slab is owned by one thread (which alone sets bits), pooled (has room, waiting
//! in its class's pool), detached (full, in no pool) or none (not a slab). Any thread
//! may free a block into it. The state word is `life << 8 | state`; `life` is bumped
//! each time the page becomes a new slab and pool entries carry it, so an entry left
//! over from an earlier life can never take the slab (no ABA).
//!
//! Properties (checked by loom): a slab with room that nobody owns ends up in exactly
//! one pool entry; a pooled slab is taken by at most one thread; an empty pooled slab
//! is either taken or retired, never both.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU32, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU32, Ordering};

pub const NONE: u32 = 0;
pub const OWNED: u32 = 1;
pub const POOLED: u32 = 2;
pub const DETACHED: u32 = 3;

const SC: Ordering = Ordering::SeqCst;

fn word(life: u32, state: u32) -> u32 {
    (life << 8) | state
}

/// Volatile state of the slab headed by one page. Whether the slab has room is
/// read from its allocation bitmap by the caller (closures below), with `SeqCst`
/// bit operations: a free clears its bit and then reads the state; the owner
/// letting go stores the state and then reads the bits, so at least one of them
/// sees the other (and the CAS makes exactly one of them pool the slab).
pub struct SlabState {
    word: AtomicU32,
    /// Free tickets outstanding for blocks of this page (keeps its APT entry).
    pub pending: AtomicU32,
}

impl Default for SlabState {
    fn default() -> Self {
        Self::new()
    }
}

impl SlabState {
    pub fn new() -> Self {
        Self {
            word: AtomicU32::new(0),
            pending: AtomicU32::new(0),
        }
    }

    pub fn state(&self) -> u32 {
        self.word.load(SC) & 0xff
    }
    pub fn life(&self) -> u32 {
        self.word.load(SC) >> 8
    }

    /// The page became a fresh, empty slab owned by the caller. Returns its life.
    pub fn fresh_owned(&self) -> u32 {
        let life = (self.life() + 1) & 0xff_ffff;
        self.word.store(word(life, OWNED), SC);
        life
    }

    /// A slab found by the chunk scan (or re-registered by recovery). Returns
    /// `Some(life)` if it has room and must be pushed to its pool.
    pub fn scanned(&self, has_room: bool) -> Option<u32> {
        let life = (self.life() + 1) & 0xff_ffff;
        if has_room {
            self.word.store(word(life, POOLED), SC);
            Some(life)
        } else {
            self.word.store(word(life, DETACHED), SC);
            None
        }
    }

    /// The owner found the slab full and lets go of it. `Some(life)`: push it.
    pub fn owner_detach(&self, has_room: impl FnOnce() -> bool) -> Option<u32> {
        let life = self.life();
        self.word.store(word(life, DETACHED), SC);
        // A free may have happened after our scan but before the store above, seen
        // OWNED and not pooled the slab; whoever sees room second pools it.
        if has_room() {
            self.repool(life)
        } else {
            None
        }
    }

    /// Some thread cleared a bit of this slab (`SeqCst`). `Some(life)`: push it.
    pub fn freed_block(&self) -> Option<u32> {
        let w = self.word.load(SC);
        if w & 0xff == DETACHED {
            self.repool(w >> 8)
        } else {
            None
        }
    }

    fn repool(&self, life: u32) -> Option<u32> {
        self.word
            .compare_exchange(word(life, DETACHED), word(life, POOLED), SC, SC)
            .ok()
            .map(|_| life)
    }

    /// The owner gives the slab up with room left (thread exit). `Some(life)`: push it.
    pub fn release_owned(&self) -> Option<u32> {
        let life = self.life();
        self.word
            .compare_exchange(word(life, OWNED), word(life, POOLED), SC, SC)
            .ok()
            .map(|_| life)
    }

    /// Takes a pooled slab through a pool entry of `life`.
    pub fn try_own(&self, life: u32) -> bool {
        self.word
            .compare_exchange(word(life, POOLED), word(life, OWNED), SC, SC)
            .is_ok()
    }

    /// Retires an empty pooled slab (its pages go back to the page allocator). The
    /// state leaves POOLED first, so no owner exists while `is_empty` reads the
    /// bits (frees only clear bits: empty stays empty).
    pub fn try_retire_empty(&self, life: u32, is_empty: impl FnOnce() -> bool) -> bool {
        if self
            .word
            .compare_exchange(word(life, POOLED), word(life, NONE), SC, SC)
            .is_err()
        {
            return false;
        }
        if is_empty() {
            return true;
        }
        self.word.store(word(life, POOLED), SC);
        false
    }
}
