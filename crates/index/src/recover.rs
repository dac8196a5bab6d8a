//! Recovery of index structures after a crash or a clean shutdown.
//!
//! 1. The heap replays committed redo logs (`Heap::open`; phash relies on it).
//! 2. Each structure is attached to its descriptor (read-only work).
//! 3. [`Recoverable::repair`]: among the block slots of active pages, nodes that
//!    were logically deleted but are still linked are unlinked, durably (their
//!    remover's ticket put them there; only their remover would have freed them).
//! 4. The heap's leak sweep asks [`Recoverable::reachable`] for every covered slot:
//!    exact reachability by searching for the block's key (log-free paper §5.5).
//!
//! Time grows with the number of covered slots, not with the number of keys.

use crate::Result;
use pmem::{Heap, PPtr, Recovery, RecoveryReport};
use std::collections::HashMap;
use std::time::Instant;

pub trait Recoverable: Sync {
    /// Finishes interrupted removals among `slots` (every block slot covered by an
    /// active page, with its size). Returns how many nodes it unlinked.
    fn repair(&self, slots: &[(PPtr<u8>, u64)]) -> Result<u64>;
    /// Exactly whether the block at `p` belongs to this structure and is linked.
    fn reachable(&self, p: PPtr<u8>) -> bool;
}

#[derive(Clone, Debug, Default)]
pub struct RecoverStats {
    pub heap: RecoveryReport,
    /// Block slots examined.
    pub slots: u64,
    /// Logically deleted nodes unlinked by repair.
    pub repaired: u64,
    /// Whole recovery (structures and sweep), microseconds.
    pub micros: u64,
}

/// Runs steps 3 and 4 for the structures `parts` (attached to `rec.heap()`), and
/// returns the heap, open for allocation.
pub fn recover(rec: Recovery, parts: &[&dyn Recoverable]) -> Result<(Heap, RecoverStats)> {
    let t = Instant::now();
    let slots = rec.covered_slots();
    let mut repaired = 0;
    for p in parts {
        repaired += p.repair(&slots)?;
    }
    // The reachability searches (one per covered slot, each a few reads at
    // random places of a heap whose pages were not touched since it was
    // mapped, so mostly page faults) run on several threads first; the sweep
    // then reads the answers.
    let known = reachability(&slots, parts);
    let (heap, report) = rec.finish(|b| match known.get(&b.offset()) {
        Some(&r) => r,
        None => parts.iter().any(|p| p.reachable(b)),
    })?;
    let stats = RecoverStats {
        micros: report.micros.max(t.elapsed().as_micros() as u64),
        heap: report,
        slots: slots.len() as u64,
        repaired,
    };
    Ok((heap, stats))
}

/// Below this many slots the searches run on the calling thread alone.
const PARALLEL_FROM: usize = 256;

/// Whether each slot is reachable from one of `parts`, searched on up to four
/// threads (the structures' searches are safe to run concurrently: they are the
/// lock-free readers, which settle a not-yet-durable link they meet).
fn reachability(slots: &[(PPtr<u8>, u64)], parts: &[&dyn Recoverable]) -> HashMap<u64, bool> {
    let one = |chunk: &[(PPtr<u8>, u64)]| -> Vec<(u64, bool)> {
        chunk
            .iter()
            .map(|(b, _)| (b.offset(), parts.iter().any(|p| p.reachable(*b))))
            .collect()
    };
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(4);
    if threads < 2 || slots.len() < PARALLEL_FROM {
        return one(slots).into_iter().collect();
    }
    let per = slots.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = slots.chunks(per).map(|c| s.spawn(move || one(c))).collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}
