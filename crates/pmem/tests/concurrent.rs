//! Concurrent allocation and cross-thread frees: no block is ever handed out twice,
//! no live block is overwritten by another allocation, the heap grows online under
//! load, and after everything is freed the metadata says so, also after reopen.

use pmem::{Geometry, Heap, HeapOptions, PPtr, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::HashSet;
use std::sync::Mutex;

const THREADS: usize = 3;
const OPS: usize = 60_000;

fn opts() -> HeapOptions {
    HeapOptions {
        size: 4 << 20,
        max_size: 256 << 20,
        geometry: Geometry::small(),
        strategy: Strategy::FenceOnly,
        ..Default::default()
    }
}

fn stamp(heap: &Heap, p: u64, len: u64, tag: u64) {
    let r = heap.region();
    r.write(p, &tag);
    r.write(p + 8, &len);
    r.write(p + len - 8, &!tag);
    r.flush(p, 16);
    r.flush(p + len - 8, 8);
}

fn verify(heap: &Heap, p: u64, len: u64, tag: u64) {
    let r = heap.region();
    assert_eq!(r.read::<u64>(p), tag, "block {p:#x} overwritten (head)");
    assert_eq!(r.read::<u64>(p + 8), len, "block {p:#x} overwritten (len)");
    assert_eq!(
        r.read::<u64>(p + len - 8),
        !tag,
        "block {p:#x} overwritten (tail)"
    );
}

#[test]
fn concurrent_alloc_and_cross_thread_free() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.heap");
    let heap = Heap::create(&path, &opts()).unwrap();
    let live: Mutex<HashSet<u64>> = Mutex::new(HashSet::new());
    let shared: Mutex<Vec<(u64, u64, u64)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let heap = heap.clone();
            let live = &live;
            let shared = &shared;
            s.spawn(move || {
                let mut th = heap.thread().unwrap();
                let mut rng = SmallRng::seed_from_u64(t as u64 + 1);
                let mut tickets = Vec::new();
                for i in 0..OPS {
                    if rng.random_bool(0.5) {
                        let len = match rng.random_range(0..100u32) {
                            0..=89 => rng.random_range(24..2048u64),
                            90..=98 => rng.random_range(2048..60_000u64),
                            _ => rng.random_range(70_000..300_000u64),
                        };
                        let p = th.alloc(len).unwrap().offset();
                        assert!(
                            live.lock().unwrap().insert(p),
                            "block {p:#x} handed out twice"
                        );
                        let tag = ((t as u64) << 48) | i as u64;
                        stamp(&heap, p, len, tag);
                        heap.region().fence();
                        shared.lock().unwrap().push((p, len, tag));
                    } else {
                        let item = {
                            let mut v = shared.lock().unwrap();
                            if v.is_empty() {
                                None
                            } else {
                                let k = rng.random_range(0..v.len());
                                Some(v.swap_remove(k))
                            }
                        };
                        if let Some((p, len, tag)) = item {
                            verify(&heap, p, len, tag);
                            assert!(live.lock().unwrap().remove(&p));
                            if rng.random_bool(0.5) {
                                th.free(PPtr::from_raw(p)).unwrap();
                            } else {
                                tickets.push(th.prepare_free(PPtr::from_raw(p)).unwrap());
                                if tickets.len() >= 32 {
                                    heap.free_tickets(std::mem::take(&mut tickets)).unwrap();
                                }
                            }
                        }
                    }
                    th.end_op();
                }
                heap.free_tickets(tickets).unwrap();
            });
        }
    });
    let rest = std::mem::take(&mut *shared.lock().unwrap());
    let mut th = heap.thread().unwrap();
    for (p, len, tag) in &rest {
        verify(&heap, *p, *len, *tag);
    }
    let rep = pmem::check_heap(&heap);
    assert!(rep.ok(), "{rep}");
    assert_eq!(rep.blocks, rest.len() as u64);
    assert!(
        heap.region().size() > opts().size,
        "the heap should have grown online"
    );
    for (p, _, _) in &rest {
        th.free(PPtr::from_raw(*p)).unwrap();
    }
    drop(th);
    let rep = pmem::check_heap(&heap);
    assert!(rep.ok(), "{rep}");
    assert_eq!(rep.blocks, 0);
    let size = heap.region().size();
    drop(heap);
    let (heap, _) = Heap::open(&path, &opts())
        .unwrap()
        .finish(|_| false)
        .unwrap();
    assert_eq!(heap.region().size(), size);
    let rep = pmem::check_heap(&heap);
    assert!(rep.ok() && rep.blocks == 0, "{rep}");
}
