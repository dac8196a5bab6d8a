use pmem::{Geometry, Heap, HeapOptions, PPtr};

fn opts() -> HeapOptions {
    HeapOptions {
        size: 4 << 20,
        geometry: Geometry::small(),
        ..Default::default()
    }
}

#[test]
fn create_alloc_tx_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.heap");
    let heap = Heap::create(&path, &opts()).unwrap();
    let mut th = heap.thread().unwrap();
    let root = th.alloc_zeroed(64).unwrap();
    heap.region().fence();
    heap.set_root(root).unwrap();
    let mut blocks = vec![];
    for i in 0..1000u64 {
        let p = th.alloc(16 + i % 300).unwrap();
        heap.region().write(p.offset(), &i);
        heap.region().persist(p.offset(), 8);
        blocks.push(p);
    }
    let big = th.alloc(200_000).unwrap();
    let huge = th.alloc(3 << 20).unwrap_err(); // 4 MiB heap, small geometry, no growth
    eprintln!("{huge}");
    {
        let mut tx = th.begin();
        let nb = tx.alloc(32).unwrap();
        tx.write_u64(nb.offset(), 77).unwrap();
        tx.write_u64(root.offset(), nb.offset()).unwrap();
        assert_eq!(tx.read_u64(root.offset()).unwrap(), nb.offset());
        tx.free(blocks[0]).unwrap();
        tx.commit().unwrap();
    }
    assert!(!heap.is_allocated(blocks[0]));
    drop(th);
    drop(heap);
    let (heap, rep) = Heap::open(&path, &opts()).unwrap().finish_clean().unwrap();
    assert!(rep.was_clean);
    let root = heap.root();
    let nb: u64 = heap.region().read(root.offset());
    assert_eq!(heap.region().read::<u64>(nb), 77);
    assert!(heap.is_allocated(PPtr::from_raw(nb)));
    assert!(heap.is_allocated(big));
    for (i, p) in blocks.iter().enumerate().skip(1) {
        assert_eq!(heap.region().read::<u64>(p.offset()), i as u64);
    }
    let rep = pmem::check_heap(&heap);
    assert!(rep.ok(), "{rep}");
    eprintln!("{rep}");
}
