//! Loom model of the slab ownership protocol (`pmem::slab_state`), with a one-word
//! bitmap standing in for the slab's allocation bitmap.
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p pmem --test loom_slab --release`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use loom::sync::Arc;
use pmem::slab_state::{SlabState, DETACHED, OWNED, POOLED};

struct Slab {
    st: SlabState,
    bits: AtomicU64,
    blocks: u32,
}

impl Slab {
    fn new(blocks: u32) -> Arc<Slab> {
        Arc::new(Slab {
            st: SlabState::new(),
            bits: AtomicU64::new(0),
            blocks,
        })
    }
    fn full_mask(&self) -> u64 {
        (1u64 << self.blocks) - 1
    }
    fn has_room(&self) -> bool {
        self.bits.load(SeqCst) & self.full_mask() != self.full_mask()
    }
    fn is_empty(&self) -> bool {
        self.bits.load(SeqCst) == 0
    }
    /// The owner claims every free bit (as `take_block` does).
    fn fill(&self) {
        let free = !self.bits.load(SeqCst) & self.full_mask();
        self.bits.fetch_or(free, SeqCst);
    }
    /// A free from any thread: clear the bit, then look at the state.
    fn free(&self, bit: u32) -> Option<u32> {
        let old = self.bits.fetch_and(!(1 << bit), SeqCst);
        assert!(old & (1 << bit) != 0, "double free in the model");
        self.st.freed_block()
    }
}

/// The owner finds its slab full and detaches it while another thread frees a
/// block: the slab (now with room) is pooled exactly once.
#[test]
fn detach_races_free() {
    loom::model(|| {
        let s = Slab::new(4);
        s.st.fresh_owned();
        s.fill();
        let pushes = Arc::new(AtomicU32::new(0));
        let (s2, p2) = (s.clone(), pushes.clone());
        let t = loom::thread::spawn(move || {
            if s2.free(1).is_some() {
                p2.fetch_add(1, SeqCst);
            }
        });
        if s.st.owner_detach(|| s.has_room()).is_some() {
            pushes.fetch_add(1, SeqCst);
        }
        t.join().unwrap();
        assert_eq!(pushes.load(SeqCst), 1);
        assert_eq!(s.st.state(), POOLED);
    });
}

/// Two frees race with the detach: still exactly one push.
#[test]
fn detach_races_two_frees() {
    loom::model(|| {
        let s = Slab::new(3);
        s.st.fresh_owned();
        s.fill();
        let pushes = Arc::new(AtomicU32::new(0));
        let mut ts = Vec::new();
        for bit in 0..2 {
            let (s2, p2) = (s.clone(), pushes.clone());
            ts.push(loom::thread::spawn(move || {
                if s2.free(bit).is_some() {
                    p2.fetch_add(1, SeqCst);
                }
            }));
        }
        if s.st.owner_detach(|| s.has_room()).is_some() {
            pushes.fetch_add(1, SeqCst);
        }
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(pushes.load(SeqCst), 1);
        assert_eq!(s.st.state(), POOLED);
    });
}

/// A full slab detached with no concurrent free is in no pool, until a free.
#[test]
fn full_slab_is_not_pooled() {
    loom::model(|| {
        let s = Slab::new(2);
        s.st.fresh_owned();
        s.fill();
        assert!(s.st.owner_detach(|| s.has_room()).is_none());
        assert_eq!(s.st.state(), DETACHED);
        assert_eq!(s.free(0), Some(s.st.life()));
        assert_eq!(s.st.state(), POOLED);
    });
}

/// Two threads pop the same pooled empty slab while a third retires it: it is
/// owned once or retired, never both.
#[test]
fn own_and_retire_are_exclusive() {
    loom::model(|| {
        let s = Slab::new(2);
        let life = s.st.fresh_owned();
        assert_eq!(s.st.release_owned(), Some(life));
        let wins = Arc::new(AtomicU32::new(0));
        let mut ts = Vec::new();
        for _ in 0..2 {
            let (s2, w2) = (s.clone(), wins.clone());
            ts.push(loom::thread::spawn(move || {
                if s2.st.try_own(life) {
                    w2.fetch_add(1, SeqCst);
                }
            }));
        }
        let retired = s.st.try_retire_empty(life, || s.is_empty());
        for t in ts {
            t.join().unwrap();
        }
        let w = wins.load(SeqCst);
        assert_eq!(w + retired as u32, 1, "owned {w} times, retired {retired}");
        assert_eq!(s.st.state(), if w == 1 { OWNED } else { 0 });
    });
}

/// Retiring a pooled slab that a free has not yet emptied fails and leaves it
/// pooled; a free racing with the retirement never pools it twice.
#[test]
fn retire_races_last_free() {
    loom::model(|| {
        let s = Slab::new(2);
        let life = s.st.fresh_owned();
        s.bits.fetch_or(1, SeqCst);
        assert_eq!(s.st.release_owned(), Some(life));
        let s2 = s.clone();
        let t = loom::thread::spawn(move || s2.free(0));
        let retired = s.st.try_retire_empty(life, || s.is_empty());
        let pushed = t.join().unwrap();
        assert!(
            pushed.is_none(),
            "a pooled slab is never pushed again by a free"
        );
        if !retired {
            assert_eq!(s.st.state(), POOLED);
        }
    });
}

/// A pool entry from an earlier life cannot take the slab after the page was
/// retired and became a slab again (the ABA the life tag prevents).
#[test]
fn stale_entry_cannot_own_new_life() {
    loom::model(|| {
        let s = Slab::new(2);
        let old = s.st.fresh_owned();
        assert_eq!(s.st.release_owned(), Some(old));
        assert!(s.st.try_retire_empty(old, || s.is_empty()));
        let new = s.st.fresh_owned();
        assert_eq!(s.st.release_owned(), Some(new));
        let s2 = s.clone();
        let t = loom::thread::spawn(move || s2.st.try_own(old));
        let mine = s.st.try_own(new);
        assert!(!t.join().unwrap());
        assert!(mine);
    });
}
