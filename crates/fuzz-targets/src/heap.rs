//! The `heap` target: `ember check` ([`ember::check::problems`], the
//! offline heap verifier: recovery in a private copy-on-write mapping, the
//! heap's allocator state, the store at the root) on heap files with bytes
//! changed.
//!
//! Two small valid heaps are made once per thread, as `ember serve` makes
//! them (`server::store::open`), one holding a Bullet store and one a
//! Direct store on the log-free hash table, each with a few keys written
//! through the command layer and shut down cleanly. An input picks one and
//! is read as a list of patches (offset, bytes) applied to a copy of it; the
//! file keeps its length (a heap file cut short under its mapping raises
//! SIGBUS by design, and `ember check` compares the lengths first). Half
//! the offsets fall in the front of the file (superblock, redo logs, active
//! page tables, the first chunk with the stores' descriptors), the rest
//! anywhere. So the corpus holds patches, not heap images.
//!
//! The heaps' layout is the same in every process, but not every byte: a
//! heap's uuid and a hash table's SipHash key are random, and so are the
//! buckets the keys land in. An input that found a bug may need a few runs
//! (or a different process) to hit it again; each bug found gets a unit
//! test beside the code it fixed.
//!
//! Checked: the check returns (an error that the file is not a usable heap,
//! or a list of problems, or none), and none of the walks it guards with a
//! panic catcher panicked.

use arbitrary::Unstructured;
use pmem::{Geometry, Heap, HeapOptions};
use server::config::{Config, DurabilityMode, EngineChoice};
use server::server::Embedded;
use server::store::{self, Startup};
use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Instant;

/// Most patches read from one input.
pub const MAX_PATCHES: usize = 32;
/// Longest patch.
pub const MAX_PATCH_LEN: usize = 16;
/// Half the patches fall in this many bytes at the front of the file.
const FRONT: usize = 256 << 10;

/// A valid heap file's bytes.
struct Base {
    bytes: Vec<u8>,
}

struct Heaps {
    bases: Vec<Base>,
    /// Where the patched copy is written.
    file: PathBuf,
    _dir: tempfile::TempDir,
}

thread_local! {
    static HEAPS: RefCell<Option<Heaps>> = const { RefCell::new(None) };
}

/// The smallest heap a Bullet store fits in with two small logs.
const HEAP_SIZE: u64 = 2 << 20;

fn make_base(dir: &std::path::Path, name: &str, engine: EngineChoice) -> Base {
    let cfg = Config {
        heap: dir.join(name),
        heap_size: HEAP_SIZE,
        heap_max_size: HEAP_SIZE,
        engine,
        durability: DurabilityMode::Pmem,
        threads: 1,
        logs: 2,
        log_size: 16 << 10,
        ..Config::default()
    };
    // The store as `ember serve` makes it, on a heap of the small geometry
    // (4 thread slots, 64-entry active page tables, 1 MiB chunks): the
    // default one's header alone is 8 MiB, which every input would copy
    // and check.
    let hopts = HeapOptions {
        geometry: Geometry::small(),
        ..store::heap_options(&cfg)
    };
    let rec = Heap::open_or_create(&cfg.heap, &hopts).expect("create a heap");
    let (st, startup) = store::open_recovered(&cfg, rec, Startup::default(), Instant::now())
        .expect("create the store");
    let sh = Embedded::start(cfg.clone(), st, startup, 1).expect("start");
    let mut e = Embedded::new(sh.clone(), 0).expect("client");
    let cmds: &[&[&str]] = &[
        &["SET", "a", "1"],
        &["SET", "b", "hello world"],
        &[
            "SET",
            "c",
            "a longer value, long enough to take a block of its own",
        ],
        &["SET", "t", "ttl", "EX", "100000"],
        &["INCR", "n"],
        &["SET", "gone", "x"],
        &["DEL", "gone"],
        &["SELECT", "3"],
        &["SET", "a", "in db 3"],
    ];
    for c in cmds {
        let args: Vec<Vec<u8>> = c.iter().map(|s| s.as_bytes().to_vec()).collect();
        let out = e.exec(&args);
        assert!(!out.starts_with(b"-"), "{c:?}: {out:?}");
    }
    e.commit().expect("commit");
    drop(e);
    Embedded::shutdown(sh).expect("shutdown");
    let bytes = std::fs::read(&cfg.heap).expect("read the heap");
    Base { bytes }
}

impl Heaps {
    fn new() -> Heaps {
        let dir = tempfile::Builder::new()
            .prefix("ember-fuzz-heap")
            .tempdir()
            .expect("temporary directory");
        let bases = vec![
            make_base(
                dir.path(),
                "bullet.heap",
                EngineChoice::Bullet(engine::bullet::Variant::Full),
            ),
            make_base(
                dir.path(),
                "direct.heap",
                EngineChoice::Direct(engine::direct::BackendKind::LogFree),
            ),
        ];
        Heaps {
            bases,
            file: dir.path().join("patched.heap"),
            _dir: dir,
        }
    }
}

/// The `heap` target (see the module documentation).
pub fn heap(data: &[u8]) {
    HEAPS.with(|h| {
        let mut h = h.borrow_mut();
        let h = h.get_or_insert_with(Heaps::new);
        run(h, data);
    });
}

fn run(h: &Heaps, data: &[u8]) {
    let mut u = Unstructured::new(data);
    let sel: u8 = u.arbitrary().unwrap_or(0);
    let base = &h.bases[usize::from(sel & 1) % h.bases.len()];
    let require_index = sel & 2 != 0;
    let mut img = base.bytes.clone();
    for _ in 0..MAX_PATCHES {
        if u.is_empty() {
            break;
        }
        let at: u32 = u.arbitrary().unwrap_or(0);
        let off = if at & 1 == 0 {
            // The front of the file: superblock, redo logs, active page
            // tables and the first chunk (the store's descriptors).
            (at as usize >> 1) % FRONT.min(img.len())
        } else {
            (at as usize >> 1) % img.len()
        };
        let len = u.int_in_range(1..=MAX_PATCH_LEN).unwrap_or(1);
        let bytes = u
            .bytes(len.min(img.len() - off).min(u.len()))
            .unwrap_or_default();
        img[off..off + bytes.len()].copy_from_slice(bytes);
    }
    std::fs::write(&h.file, &img).expect("write the patched heap");
    if let Ok(problems) = ember::check::problems(&h.file, require_index) {
        for p in &problems {
            assert!(!p.contains("panicked"), "ember check: {p}");
        }
    }
}
