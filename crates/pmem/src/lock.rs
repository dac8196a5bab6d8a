//! Persistent spinlocks with generation numbers (Bullet §2.2).
//!
//! A lock word lives in the heap: `generation << 1 | held`. It is held only if the
//! held bit is set *and* its generation is the region's current open generation,
//! which is bumped at every read-write open. So a lock held when the process died
//! is free after restart, with no recovery pass over the locks. Lock words are never
//! flushed: their persisted value does not matter.

use crate::region::Region;
use std::sync::atomic::Ordering;

/// A guard releasing the persistent lock at `off` on drop.
pub struct PLockGuard<'a> {
    region: &'a Region,
    off: u64,
}

fn held_value(region: &Region) -> u64 {
    (region.generation() << 1) | 1
}

fn is_held(region: &Region, v: u64) -> bool {
    v & 1 == 1 && (v >> 1) == region.generation()
}

/// Tries once to take the lock word at `off` (8-aligned).
pub fn try_lock(region: &Region, off: u64) -> Option<PLockGuard<'_>> {
    let a = region.atomic_u64(off);
    let v = a.load(Ordering::Relaxed);
    if is_held(region, v) {
        return None;
    }
    a.compare_exchange(v, held_value(region), Ordering::Acquire, Ordering::Relaxed)
        .ok()
        .map(|_| PLockGuard { region, off })
}

/// Takes the lock word at `off`, spinning (then yielding) while another holds it.
pub fn lock(region: &Region, off: u64) -> PLockGuard<'_> {
    let mut spins = 0u32;
    loop {
        if let Some(g) = try_lock(region, off) {
            return g;
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Whether the lock word at `off` is held in the current generation.
pub fn is_locked(region: &Region, off: u64) -> bool {
    is_held(region, region.atomic_u64(off).load(Ordering::Acquire))
}

impl Drop for PLockGuard<'_> {
    fn drop(&mut self) {
        self.region
            .atomic_u64(self.off)
            .store(self.region.generation() << 1, Ordering::Release);
    }
}
