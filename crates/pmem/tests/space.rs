//! File space: every page of a heap has its block reserved before it is used
//! (at creation, at growth, and at the open of a sparse heap), so that a full
//! file system is an error value, never a SIGBUS on a store.

use pmem::{Geometry, Heap, HeapOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

fn opts() -> HeapOptions {
    HeapOptions {
        size: 8 << 20,
        max_size: 64 << 20,
        geometry: Geometry::small(),
        ..Default::default()
    }
}

/// Bytes of blocks the file has, and its length.
fn blocks(path: &Path) -> (u64, u64) {
    let m = std::fs::metadata(path).unwrap();
    (m.blocks() * 512, m.len())
}

/// A directory on a file system that reserves blocks (the test's premise);
/// None where fallocate is not supported (then there is nothing to check).
fn dir() -> Option<tempfile::TempDir> {
    let d = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(d.path().join("probe")).unwrap();
    // SAFETY: fallocate on a file we own.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 4096) };
    (rc == 0).then_some(d)
}

#[test]
fn a_new_heap_and_its_growth_are_reserved() {
    let Some(d) = dir() else {
        eprintln!("fallocate is not supported here: nothing to check");
        return;
    };
    let path = d.path().join("h");
    let heap = Heap::create(&path, &opts()).unwrap();
    let (b, len) = blocks(&path);
    assert!(
        b >= len,
        "a new heap of {len} bytes has {b} bytes of blocks"
    );
    heap.grow(32 << 20).unwrap();
    let (b, len) = blocks(&path);
    assert!(len >= 32 << 20);
    assert!(
        b >= len,
        "a grown heap of {len} bytes has {b} bytes of blocks"
    );
}

/// A heap with holes (written before its blocks were reserved, or copied
/// sparse) gets them reserved when it is opened for writing.
#[test]
fn opening_a_sparse_heap_reserves_its_holes() {
    let Some(d) = dir() else {
        eprintln!("fallocate is not supported here: nothing to check");
        return;
    };
    let path = d.path().join("h");
    drop(Heap::create(&path, &opts()).unwrap());
    {
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        // SAFETY: punches a hole in a file we own (not mapped by anyone now).
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                4 << 20,
                2 << 20,
            )
        };
        if rc != 0 {
            eprintln!("cannot punch holes here: nothing to check");
            return;
        }
    }
    let (b, len) = blocks(&path);
    assert!(b < len, "the hole was not punched ({b} of {len})");
    let (heap, _) = Heap::open(&path, &opts())
        .unwrap()
        .finish(|_| true)
        .unwrap();
    let (b, len) = blocks(&path);
    assert!(
        b >= len,
        "an opened sparse heap of {len} bytes has {b} bytes of blocks"
    );
    drop(heap);
}
