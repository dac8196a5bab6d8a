//! Loom model of the slab ownership protocol (`pmem::slab_state`).
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p pmem --test loom_slab --release`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::Arc;
use pmem::slab_state::{SlabState, DETACHED, OWNED, POOLED};

/// The owner finds its slab full and detaches it while another thread frees a
/// block: the slab (now with room) is pooled exactly once.
#[test]
fn detach_races_free() {
    loom::model(|| {
        let s = Arc::new(SlabState::new());
        let blocks = 4;
        s.fresh_owned();
        for _ in 0..blocks {
            s.took_block();
        }
        let pushes = Arc::new(AtomicU32::new(0));
        let (s2, p2) = (s.clone(), pushes.clone());
        let t = loom::thread::spawn(move || {
            if s2.freed_block().is_some() {
                p2.fetch_add(1, Ordering::SeqCst);
            }
        });
        if s.owner_detach(blocks).is_some() {
            pushes.fetch_add(1, Ordering::SeqCst);
        }
        t.join().unwrap();
        assert_eq!(pushes.load(Ordering::SeqCst), 1);
        assert_eq!(s.state(), POOLED);
        assert_eq!(s.used(), blocks - 1);
    });
}

/// Two frees race with the detach: still exactly one push.
#[test]
fn detach_races_two_frees() {
    loom::model(|| {
        let s = Arc::new(SlabState::new());
        let blocks = 3;
        s.fresh_owned();
        for _ in 0..blocks {
            s.took_block();
        }
        let pushes = Arc::new(AtomicU32::new(0));
        let mut ts = Vec::new();
        for _ in 0..2 {
            let (s2, p2) = (s.clone(), pushes.clone());
            ts.push(loom::thread::spawn(move || {
                if s2.freed_block().is_some() {
                    p2.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        if s.owner_detach(blocks).is_some() {
            pushes.fetch_add(1, Ordering::SeqCst);
        }
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(pushes.load(Ordering::SeqCst), 1);
        assert_eq!(s.state(), POOLED);
    });
}

/// A full slab detached with no concurrent free is in no pool.
#[test]
fn full_slab_is_not_pooled() {
    loom::model(|| {
        let s = SlabState::new();
        s.fresh_owned();
        s.took_block();
        assert!(s.owner_detach(1).is_none());
        assert_eq!(s.state(), DETACHED);
        assert_eq!(s.freed_block(), Some(s.life()));
        assert_eq!(s.state(), POOLED);
    });
}

/// Two threads pop the same pooled slab: one owns it. A third retires it if empty:
/// never both owned and retired.
#[test]
fn own_and_retire_are_exclusive() {
    loom::model(|| {
        let s = Arc::new(SlabState::new());
        let life = s.fresh_owned();
        let life = {
            assert_eq!(s.release_owned(), Some(life));
            life
        };
        let wins = Arc::new(AtomicU32::new(0));
        let retired = Arc::new(AtomicU32::new(0));
        let mut ts = Vec::new();
        for _ in 0..2 {
            let (s2, w2) = (s.clone(), wins.clone());
            ts.push(loom::thread::spawn(move || {
                if s2.try_own(life) {
                    w2.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        if s.try_retire_empty(life) {
            retired.fetch_add(1, Ordering::SeqCst);
        }
        for t in ts {
            t.join().unwrap();
        }
        let (w, r) = (wins.load(Ordering::SeqCst), retired.load(Ordering::SeqCst));
        assert_eq!(w + r, 1, "owned {w} times, retired {r} times");
        assert_eq!(s.state(), if w == 1 { OWNED } else { 0 });
    });
}

/// A pool entry from an earlier life cannot take the slab after the page was
/// retired and became a slab again (the ABA the life tag prevents).
#[test]
fn stale_entry_cannot_own_new_life() {
    loom::model(|| {
        let s = Arc::new(SlabState::new());
        let old = s.fresh_owned();
        assert_eq!(s.release_owned(), Some(old));
        assert!(s.try_retire_empty(old));
        let new = s.fresh_owned();
        assert_eq!(s.release_owned(), Some(new));
        let s2 = s.clone();
        let t = loom::thread::spawn(move || s2.try_own(old));
        let mine = s.try_own(new);
        let stale = t.join().unwrap();
        assert!(!stale);
        assert!(mine);
    });
}
