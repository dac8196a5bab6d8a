//! End-to-end tests of the `ember` binary: `check` on good and damaged heaps, and
//! the benchmarks with tiny parameters.

use pmem::layout::{Superblock, MIB, SB_A, SB_B, SB_LEN};
use pmem::{CrashSim, Geometry, Heap, HeapOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

fn opts() -> HeapOptions {
    HeapOptions {
        size: 4 * MIB,
        geometry: Geometry::small(),
        reserve: 64 * MIB,
        ..Default::default()
    }
}

/// A heap with a few blocks of every kind and a root, closed cleanly.
fn make_heap(dir: &Path) -> PathBuf {
    let path = dir.join("good.heap");
    let heap = Heap::create(&path, &opts()).unwrap();
    let mut th = heap.thread().unwrap();
    let root = th.alloc_zeroed(64).unwrap();
    for (i, size) in [16u64, 100, 5000, 20_000, 200_000].into_iter().enumerate() {
        let p = th.alloc(size).unwrap();
        heap.region().write(p.offset(), &(i as u64));
        heap.region().flush(p.offset(), 8);
        th.end_op();
    }
    let gone = th.alloc(48).unwrap();
    th.free(gone).unwrap();
    th.transaction(|tx| {
        let nb = tx.alloc(32)?;
        tx.write_u64(nb.offset(), 77)?;
        tx.write_u64(root.offset(), nb.offset())
    })
    .unwrap();
    heap.region().fence();
    heap.set_root(root).unwrap();
    drop(th);
    drop(heap);
    path
}

fn ember(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .output()
        .expect("run ember")
}

fn check(path: &Path, json: bool) -> Output {
    let p = path.to_str().unwrap();
    if json {
        ember(&["check", p, "--json"])
    } else {
        ember(&["check", p])
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts exit 1 and a stderr line `ember check: ...` naming the file and `what`.
fn assert_rejected(path: &Path, what: &str) -> String {
    let out = check(path, false);
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {}\nstderr: {err}",
        text(&out.stdout)
    );
    let line = err
        .lines()
        .find(|l| l.starts_with("ember check: ") && l.contains(&*path.to_string_lossy()))
        .unwrap_or_else(|| panic!("no line naming {} in stderr: {err}", path.display()));
    assert!(
        err.to_lowercase().contains(&what.to_lowercase()),
        "stderr lacks {what:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    line.to_string()
}

fn assert_accepted(path: &Path) -> String {
    let out = check(path, false);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    assert!(stdout.contains("consistent"), "{stdout}");
    stdout
}

fn read_sb(path: &Path, off: u64) -> Option<Superblock> {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; SB_LEN];
    f.read_exact_at(&mut b, off).unwrap();
    Superblock::decode(path, &b).unwrap()
}

/// The offset of the superblock copy with the higher sequence number.
fn current_sb_off(path: &Path) -> u64 {
    let a = read_sb(path, SB_A).expect("copy A valid");
    let b = read_sb(path, SB_B).expect("copy B valid");
    if a.seq >= b.seq {
        SB_A
    } else {
        SB_B
    }
}

fn write_at(path: &Path, off: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
    f.sync_all().unwrap();
}

/// Damages a superblock copy's body (not its magic) so that its checksum fails.
fn break_sb_checksum(path: &Path, off: u64) {
    write_at(path, off + 40, &[0x5a; 16]);
}

#[test]
fn check_accepts_a_fresh_heap() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    let out = assert_accepted(&path);
    for field in [
        "file:",
        "format version:   1",
        "uuid:",
        "size:",
        "generation:",
        "clean shutdown:   yes",
        "geometry:",
        "redo logs replayed in memory: 0",
        "active pages:",
        "allocated:",
    ] {
        assert!(out.contains(field), "missing {field:?} in:\n{out}");
    }
    assert!(out.contains(&*path.to_string_lossy()), "{out}");
    // The uuid is printed in canonical hex form.
    let sb = read_sb(&path, current_sb_off(&path)).unwrap();
    let hex: String = sb.uuid.iter().map(|b| format!("{b:02x}")).collect();
    let line = out.lines().find(|l| l.starts_with("uuid:")).unwrap();
    assert_eq!(
        line.split_whitespace().nth(1).unwrap().replace('-', ""),
        hex
    );
}

#[test]
fn check_never_writes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    let before = std::fs::read(&path).unwrap();
    assert_accepted(&path);
    assert_accepted(&path);
    assert!(
        std::fs::read(&path).unwrap() == before,
        "check modified the heap file"
    );
}

#[test]
fn check_json_for_a_good_heap() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    let out = check(&path, true);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["ok"], true);
    assert_eq!(v["problems"].as_array().unwrap().len(), 0);
    assert_eq!(v["format_version"], 1);
    assert_eq!(v["clean_shutdown"], true);
    assert_eq!(v["txs_replayed"], 0);
    assert_eq!(v["file"], path.to_str().unwrap());
    assert_eq!(v["geometry"]["chunk_pages"], Geometry::small().chunk_pages);
    assert_eq!(v["geometry"]["nslots"], Geometry::small().nslots);
    assert!(v["size"].as_u64().unwrap() >= 4 * MIB);
    assert!(v["generation"].as_u64().unwrap() >= 1);
    assert!(v["report"]["blocks"].as_u64().unwrap() >= 6);
    assert!(v["uuid"].as_str().unwrap().len() == 36);
    assert!(v["active_pages"].is_u64());
}

#[test]
fn check_rejects_a_foreign_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("words.txt");
    let line = "the quick brown fox jumps over the lazy dog\n";
    std::fs::write(&path, line.repeat((MIB as usize) / line.len() + 1)).unwrap();
    assert_rejected(&path, "not an Ember heap");
}

#[test]
fn check_rejects_an_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.heap");
    std::fs::write(&path, b"").unwrap();
    assert_rejected(&path, "not an Ember heap");
}

#[test]
fn check_rejects_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.heap");
    assert_rejected(&path, "no such file");
}

#[test]
fn check_rejects_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    assert_rejected(dir.path(), "not a regular file");
}

#[test]
fn check_rejects_special_files_without_hanging() {
    assert_rejected(Path::new("/dev/zero"), "not a regular file");
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert_rejected(&fifo, "not a regular file");
}

#[test]
fn check_rejects_a_truncated_heap() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - MIB).unwrap();
    drop(f);
    assert_rejected(&path, "truncated");
}

#[test]
fn check_rejects_both_superblock_copies_corrupted() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    break_sb_checksum(&path, SB_A);
    break_sb_checksum(&path, SB_B);
    assert_rejected(&path, "both superblock copies fail their checksum");
}

#[test]
fn check_rejects_both_superblock_copies_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    write_at(&path, SB_A, &[0xff; SB_LEN]);
    write_at(&path, SB_B, &[0xff; SB_LEN]);
    assert_rejected(&path, "not an Ember heap");
}

#[test]
fn check_accepts_one_corrupted_superblock_copy() {
    for which in [SB_A, SB_B] {
        let dir = tempfile::tempdir().unwrap();
        let path = make_heap(dir.path());
        break_sb_checksum(&path, which);
        assert!(read_sb(&path, which).is_none(), "copy {which} still valid");
        assert_accepted(&path);
    }
}

#[test]
fn check_rejects_a_newer_format_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    let off = current_sb_off(&path);
    let mut sb = read_sb(&path, off).unwrap();
    sb.version += 1;
    write_at(&path, off, &sb.encode());
    let line = assert_rejected(&path, "newer");
    assert!(line.contains(&format!("version {}", sb.version)), "{line}");
}

#[test]
fn check_reports_a_corrupt_page_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    let sb = read_sb(&path, current_sb_off(&path)).unwrap();
    let page = sb.geometry.chunk_pages - 1;
    let off = sb.geometry.chunk_off(0) + 64 + 8 * page;
    write_at(&path, off, &0xdead_beef_dead_beefu64.to_le_bytes());
    let line = assert_rejected(&path, &format!("chunk 0 page {page}"));
    assert!(
        line.starts_with(&format!("ember check: {}: chunk 0 page", path.display())),
        "{line}"
    );
    // The summary still goes to stdout, with the verdict.
    let out = check(&path, false);
    assert!(
        text(&out.stdout).contains("INCONSISTENT"),
        "{}",
        text(&out.stdout)
    );
    // And the JSON form says so too.
    let out = check(&path, true);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["ok"], false);
    let problems = v["problems"].as_array().unwrap();
    assert!(!problems.is_empty());
    assert!(problems[0].as_str().unwrap().contains("chunk 0 page"));
}

#[test]
fn check_reports_a_heap_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    let (heap, _) = Heap::open(&path, &opts()).unwrap().finish_clean().unwrap();
    assert_rejected(&path, "in use");
    // Once the holder closes the heap, check succeeds again.
    drop(heap);
    assert_accepted(&path);
}

#[test]
fn check_open_error_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.heap");
    let out = check(&path, true);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["ok"], false);
    assert!(v["error"].as_str().unwrap().contains("nope.heap"));
}

/// Crash images taken at every fence of a transaction all check clean; the ones
/// taken after the commit point carry a committed redo log, which check replays in
/// memory only.
#[test]
fn check_crash_images_of_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    let sim = Arc::new(CrashSim::new(7, 0));
    let (heap, _) = Heap::open_sim(&path, &opts(), sim.clone())
        .unwrap()
        .finish_clean()
        .unwrap();
    let root = heap.root();
    let mut th = heap.thread().unwrap();
    sim.set_capture_ppm(1_000_000);
    th.transaction(|tx| {
        let nb = tx.alloc(40)?;
        tx.write_u64(nb.offset(), 99)?;
        tx.write_u64(root.offset() + 8, 12345)?;
        tx.write_u64(root.offset(), nb.offset())
    })
    .unwrap();
    sim.set_capture_ppm(0);
    let images = sim.take_images();
    drop(th);
    drop(heap);
    assert!(images.len() >= 3, "{} images", images.len());
    let mut replayed = 0;
    for (i, img) in images.iter().enumerate() {
        let p = dir.path().join(format!("crash{i}.heap"));
        pmem::sim::write_image(&p, &img.bytes).unwrap();
        let before = std::fs::read(&p).unwrap();
        let out = assert_accepted(&p);
        assert!(out.contains("clean shutdown:   no"), "{out}");
        if out.contains("redo logs replayed in memory: 1") {
            replayed += 1;
        }
        assert!(
            std::fs::read(&p).unwrap() == before,
            "check wrote crash image {i}"
        );
    }
    assert!(replayed >= 1, "no image held a committed log");
}

#[test]
fn bench_alloc_tiny() {
    let out = ember(&[
        "bench", "alloc", "--ops", "2000", "--rounds", "1", "--window", "64", "--batch", "16",
    ]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}\n{}", text(&out.stderr));
    for f in [
        "machine:",
        "strategy:",
        "fence_ns:",
        "threads: 1",
        "ops_per_sec_per_thread",
        "ns_per_op",
        "fences_per_op",
        "flushes_per_op",
        "ratio_vs_system",
        "system",
        "immediate",
        "batched",
    ] {
        assert!(s.contains(f), "missing {f:?} in:\n{s}");
    }
}

#[test]
fn bench_alloc_json_two_threads() {
    let dir = tempfile::tempdir().unwrap();
    let heap = dir.path().join("bench.heap");
    let out = ember(&[
        "bench",
        "alloc",
        "--threads",
        "2",
        "--ops",
        "2000",
        "--rounds",
        "1",
        "--strategy",
        "fence-only",
        "--heap",
        heap.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["bench"], "alloc");
    assert_eq!(v["threads"], 2);
    assert_eq!(v["strategy"], "fence-only");
    assert_eq!(v["fence_ns"], 0);
    assert!(v["machine"]["cpu"].is_string());
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    for m in ["system", "immediate", "batched"] {
        let x = &v["modes"][m];
        for k in [
            "ops_per_sec_per_thread",
            "ns_per_op",
            "fences_per_op",
            "flushes_per_op",
            "ratio_vs_system",
        ] {
            assert!(x[k].is_number(), "{m}.{k} missing: {x}");
        }
        assert!(x["ops_per_sec_per_thread"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(v["modes"]["system"]["fences_per_op"], 0.0);
    // Small-block allocation and free need no fence (their pages are covered by
    // the active page table): only a new slab or a table change fences.
    for m in ["immediate", "batched"] {
        let f = v["modes"][m]["fences_per_op"].as_f64().unwrap();
        assert!(f < 0.05, "{m} fences/op {f}");
    }
    assert!(!heap.exists(), "the bench heap was not removed");
}

#[test]
fn bench_alloc_rejects_bad_arguments() {
    let out = ember(&["bench", "alloc", "--strategy", "bogus"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("bogus"));
    let out = ember(&["bench", "alloc", "--size", "4"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--size"));
}

#[test]
fn bench_persist_tiny() {
    let out = ember(&["bench", "persist", "--iters", "500", "--rounds", "1"]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}\n{}", text(&out.stderr));
    for f in [
        "machine:",
        "fence_ns:",
        "ns_per_record",
        "fences_per_record",
        "flushes_per_record",
        "clwb",
        "clflushopt",
        "clflush",
        "fence-only",
        "msync",
    ] {
        assert!(s.contains(f), "missing {f:?} in:\n{s}");
    }
}

#[test]
fn bench_persist_json() {
    let out = ember(&[
        "bench", "persist", "--iters", "300", "--rounds", "1", "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["bench"], "persist");
    let list = v["strategies"].as_array().unwrap();
    let names: Vec<&str> = list
        .iter()
        .map(|s| s["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["clwb", "clflushopt", "clflush", "fence-only", "msync"]
    );
    for s in list {
        if s["supported"] == true {
            assert!(s["ns_per_record"].as_f64().unwrap() > 0.0, "{s}");
            assert_eq!(s["fences_per_record"], 1.0, "{s}");
        } else {
            assert!(s.get("ns_per_record").is_none());
        }
    }
    let msync = list.iter().find(|s| s["strategy"] == "msync").unwrap();
    assert_eq!(msync["supported"], true);
    assert_eq!(msync["msyncs_per_record"], 1.0);
}
