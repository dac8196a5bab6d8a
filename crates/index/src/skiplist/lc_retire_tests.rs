//! Link cache on: an update CASes the value link through the cache (not yet
//! durable). Its old value block must not be freed before that link is
//! durable (it was retired at once: once the handle's tickets went to the
//! epoch and a grace period passed, the block was free while the persisted
//! image of the node's value link still pointed at it).
use super::*;
use crate::test_util::{images_linking, sim_opts as opts};
use pmem::CrashSim;

fn k(i: u32) -> Vec<u8> {
    format!("key{i:04}").into_bytes()
}

#[test]
fn old_value_not_freed_before_new_value_link_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h");
    let sopts = SkipOptions::default();
    assert!(sopts.link_cache);
    {
        let heap = Heap::create(&path, &opts()).unwrap();
        let t = SkipList::create(&heap, &sopts).unwrap();
        heap.set_root(t.root()).unwrap();
        t.close().unwrap();
    }
    let sim = Arc::new(CrashSim::new(7, 0));
    let rec = Heap::open_sim(&path, &opts(), sim.clone()).unwrap();
    let root = rec.heap().root();
    let t = SkipList::attach(rec.heap(), root, &sopts).unwrap();
    let (heap, _) = crate::recover(rec, &[&t]).unwrap();
    let r = heap.region();
    let mut a = t.handle().unwrap();
    for i in 0..8 {
        assert!(a.insert(&k(i), &[1u8; 100]).unwrap());
    }
    a.sync().unwrap();
    let (n0, old) = a.locate(&k(0)).unwrap();
    let (n0, old) = (n0.raw(), old.raw());
    // The update of k0: its value link goes through the cache.
    a.put(&k(0), &[2u8; 100]).unwrap();
    assert_ne!(ptr(link::load(r, val_at(n0))), old);
    assert!(t.link_cache().unwrap().busy() > 0);
    let stale = || images_linking(&sim, r, val_at(n0), old);
    assert!(stale() > 0, "the new value link is durable already");
    // Whatever the handle retired goes to the epoch, and the grace period
    // passes (the handle is unpinned between operations).
    a.part.hand_over();
    for _ in 0..4 {
        t.inner.domain.collect();
    }
    assert!(stale() > 0, "the new value link became durable");
    assert!(
        heap.is_allocated(PPtr::from_raw(old)),
        "the old value block was freed while the persisted value link still linked it"
    );
    std::mem::forget(a);
}
