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

/// Volatile state of the slab headed by one page.
pub struct SlabState {
    word: AtomicU32,
    used: AtomicU32,
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
            used: AtomicU32::new(0),
            pending: AtomicU32::new(0),
        }
    }

    pub fn state(&self) -> u32 {
        self.word.load(SC) & 0xff
    }
    pub fn life(&self) -> u32 {
        self.word.load(SC) >> 8
    }
    pub fn used(&self) -> u32 {
        self.used.load(SC)
    }

    /// The page became a fresh, empty slab owned by the caller. Returns its life.
    pub fn fresh_owned(&self) -> u32 {
        let life = (self.life() + 1) & 0xff_ffff;
        self.used.store(0, SC);
        self.word.store(word(life, OWNED), SC);
        life
    }

    /// A slab found by the chunk scan with `used` blocks. Returns `Some(life)` if it
    /// has room and must be pushed to its pool.
    pub fn scanned(&self, used: u32, blocks: u32) -> Option<u32> {
        let life = (self.life() + 1) & 0xff_ffff;
        self.used.store(used, SC);
        if used < blocks {
            self.word.store(word(life, POOLED), SC);
            Some(life)
        } else {
            self.word.store(word(life, DETACHED), SC);
            None
        }
    }

    /// The owner set a bit.
    pub fn took_block(&self) {
        self.used.fetch_add(1, SC);
    }

    /// The owner found the slab full and lets go of it. `Some(life)`: push it.
    pub fn owner_detach(&self, blocks: u32) -> Option<u32> {
        let life = self.life();
        self.word.store(word(life, DETACHED), SC);
        // A free may have happened after our scan but before the store above, seen
        // OWNED and not pooled the slab; whoever sees room second pools it.
        if self.used.load(SC) < blocks {
            self.repool(life)
        } else {
            None
        }
    }

    /// Some thread cleared a bit of this slab. `Some(life)`: push it.
    pub fn freed_block(&self) -> Option<u32> {
        self.used.fetch_sub(1, SC);
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

    /// Retires an empty pooled slab (its pages go back to the page allocator).
    pub fn try_retire_empty(&self, life: u32) -> bool {
        if self.used.load(SC) != 0 {
            return false;
        }
        if self
            .word
            .compare_exchange(word(life, POOLED), word(life, NONE), SC, SC)
            .is_err()
        {
            return false;
        }
        // Only an owner sets bits and there is none; a free cannot make it non-empty.
        debug_assert_eq!(self.used.load(SC), 0);
        true
    }
}
