//! End-to-end tests of the `ember` binary: `check` on good and damaged heaps
//! (the benchmarks' own tests are in crates/bench/tests).

use pmem::layout::{Superblock, MIB, SB_A, SB_B, SB_LEN};
use pmem::{CrashSim, Geometry, Heap, HeapOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

mod bench_common;

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
        "format version:   2",
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
    assert_eq!(v["format_version"], 2);
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

/// Runs the hidden `bench recovery-fill` child (`ember bench`, which execs the
/// harness): builds a structure of `size` keys in a new heap at `path`, and
/// once it says `ready`, kills it with SIGKILL.
/// Returns the `ready` line (`ready N keys ...`; `~N` while updating).
fn fill_and_kill(path: &Path, structure: &str, imp: &str, size: u64, after: &str) -> String {
    use std::io::BufRead;
    bench_common::harness();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["bench", "recovery-fill", "--path"])
        .arg(path)
        .args([
            "--structure",
            structure,
            "--impl",
            imp,
            "--size",
            &size.to_string(),
            "--threads",
            "2",
            "--updates",
            "500",
            "--after-ready",
            after,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the fill child");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if after == "exit" {
        // A clean shutdown: no kill.
        let st = child.wait().unwrap();
        assert!(
            line.starts_with("ready") && st.success(),
            "child said {line:?} ({st})"
        );
        return line;
    }
    if after == "update" {
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    child.kill().unwrap();
    let st = child.wait().unwrap();
    assert!(line.starts_with("ready"), "child said {line:?} ({st})");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st}");
    line
}

/// Retries `f` while the heap is "in use". The heap's lock is an flock on the
/// open file: a process that another test thread is starting at the moment holds
/// a copy of every open descriptor of this process until its exec closes them,
/// and on a loaded machine that window can last milliseconds.
fn retry_in_use<T>(mut f: impl FnMut() -> (T, bool)) -> T {
    for _ in 0..40 {
        let (v, in_use) = f();
        if !in_use {
            return v;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    f().0
}

fn check_json(path: &Path) -> (Option<i32>, serde_json::Value, String) {
    let out = retry_in_use(|| {
        let out = check(path, true);
        let busy = text(&out.stderr).contains("in use");
        (out, busy)
    });
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("invalid JSON ({e}): {}", text(&out.stdout)));
    (out.status.code(), v, err)
}

#[test]
fn check_verifies_index_structures_after_sigkill() {
    for (structure, imp, name) in [
        ("hash", "logfree", "hash"),
        ("hash", "logfree-nocache", "hash"),
        ("hash", "redo", "phash"),
        ("skiplist", "logfree", "skiplist"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idx.heap");
        // Killed while idle: the exact key count is known.
        let line = fill_and_kill(&path, structure, imp, 3000, "idle");
        let keys: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let before = std::fs::read(&path).unwrap();
        let (code, v, err) = check_json(&path);
        assert_eq!(code, Some(0), "{imp}: {v}\n{err}");
        assert_eq!(v["ok"], true);
        assert_eq!(v["clean_shutdown"], false);
        let s = &v["structure"];
        assert_eq!(s["name"], name, "{s}");
        let hash = if name == "skiplist" {
            serde_json::Value::Null
        } else {
            "siphash-1-3, keyed".into()
        };
        assert_eq!(s["key_hash"], hash, "{s}");
        assert_eq!(s["keys"], keys, "{imp}: {s}");
        assert_eq!(s["recovered_in_memory"], true);
        assert_eq!(s["blocks"], s["heap_blocks_after_recovery"], "{s}");
        // Handles synced and dropped before the kill trim their active page
        // tables, so there may be nothing left to examine; the count is reported.
        assert!(s["slots_examined"].as_u64().is_some(), "{s}");
        assert!(
            std::fs::read(&path).unwrap() == before,
            "check wrote the heap"
        );
        // The human summary names the structure and says consistent.
        let out = assert_accepted(&path);
        assert!(
            out.contains(&format!("structure:        {name}, {keys} keys")),
            "{out}"
        );

        // Killed in the middle of updates: still consistent.
        let path2 = dir.path().join("busy.heap");
        fill_and_kill(&path2, structure, imp, 3000, "update");
        let (code, v, err) = check_json(&path2);
        assert_eq!(code, Some(0), "{imp} (busy): {v}\n{err}");
        let k = v["structure"]["keys"].as_u64().unwrap();
        assert!((2000..4000).contains(&k), "{imp}: {k} keys");
    }
}

/// Offsets (16-aligned) of blocks in the heap file starting with `tag`.
fn find_tags(path: &Path, tag: &[u8; 4]) -> Vec<u64> {
    let bytes = std::fs::read(path).unwrap();
    (0..bytes.len() / 16)
        .map(|i| i * 16)
        .filter(|&o| &bytes[o..o + 4] == tag)
        .map(|o| o as u64)
        .collect()
}

#[test]
fn check_reports_a_corrupt_index_node_without_panicking() {
    // (what is damaged, bytes written at node + offset, words expected in the problem)
    let cases: [(&str, u64, &[u8], &str); 3] = [
        (
            "next link out of the heap",
            16,
            &0x7fff_0000_0000_0000u64.to_le_bytes(),
            "outside the heap",
        ),
        (
            "next link into the heap header",
            16,
            &0x10_0000u64.to_le_bytes(),
            "node",
        ),
        ("key byte", 32, &[0xa5], "split key"),
    ];
    for (what, off, bytes, expect) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.heap");
        fill_and_kill(&path, "hash", "logfree", 2000, "idle");
        let nodes = find_tags(&path, b"EHND");
        assert!(nodes.len() >= 2000, "{} nodes found", nodes.len());
        // Damage every node: at least the linked ones are found.
        for n in &nodes {
            write_at(&path, n + off, bytes);
        }
        let (code, v, err) = check_json(&path);
        assert_eq!(code, Some(1), "{what}: {v}");
        assert_eq!(v["ok"], false);
        let problems = v["problems"].as_array().unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p.as_str().unwrap().contains(expect)),
            "{what}: {problems:?}"
        );
        assert_eq!(v["structure"]["name"], "hash");
        assert!(err.contains("ember check: "), "{err}");
        let out = check(&path, false);
        assert_eq!(out.status.code(), Some(1));
        assert!(text(&out.stdout).contains("INCONSISTENT"));
        assert!(!text(&out.stderr).contains("panicked"));
    }
}

#[test]
fn check_reports_a_damaged_descriptor_and_a_leak() {
    let dir = tempfile::tempdir().unwrap();
    // A descriptor with the hash table's tag but a bad version: a problem.
    let path = dir.path().join("desc.heap");
    fill_and_kill(&path, "hash", "logfree", 500, "idle");
    let root = read_sb(&path, current_sb_off(&path)).unwrap().root;
    write_at(&path, root + 4, &77u32.to_le_bytes());
    let (code, v, _) = check_json(&path);
    assert_eq!(code, Some(1), "{v}");
    assert!(
        v["problems"][0].as_str().unwrap().contains("hash table"),
        "{v}"
    );

    // A block allocated outside every active page and linked from nowhere: a
    // leak the sweep cannot see, found by comparing block counts.
    let path = dir.path().join("leak.heap");
    fill_and_kill(&path, "hash", "logfree", 500, "exit");
    let (heap, _) = {
        let rec = retry_in_use(|| match Heap::open(&path, &HeapOptions::default()) {
            Err(pmem::Error::InUse { .. }) => (None, true),
            r => (Some(r.unwrap()), false),
        })
        .expect("heap not in use");
        let t = index::any::attach_any(rec.heap(), rec.heap().root()).unwrap();
        index::recover(rec, &[&t]).unwrap()
    };
    let mut th = heap.thread().unwrap();
    th.alloc(100).unwrap();
    th.end_op();
    drop(th);
    drop(heap); // clean close: the block's page leaves the active page table
    let (code, v, _) = check_json(&path);
    assert_eq!(code, Some(1), "{v}");
    assert!(
        v["problems"][0]
            .as_str()
            .unwrap()
            .contains("1 allocated blocks are not reachable"),
        "{v}"
    );
}

#[test]
fn check_notes_a_root_that_is_no_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_heap(dir.path());
    let (code, v, _) = check_json(&path);
    assert_eq!(code, Some(0));
    assert!(v["structure"]["note"]
        .as_str()
        .unwrap()
        .contains("not a known index structure"));
    let out = retry_in_use(|| {
        let out = ember(&["check", path.to_str().unwrap(), "--require-index"]);
        let busy = text(&out.stderr).contains("in use");
        (out, busy)
    });
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("not a known index structure"));
}

/// A Bullet store with records still in its logs: `check` recognises the
/// root, reads the logs and counts the pool's blocks as the store's.
#[test]
fn check_verifies_a_bullet_store_with_records_in_its_logs() {
    use engine::bullet::{BulletOptions, BulletStore};
    use engine::direct::BackendOptions;
    use engine::{Op, Session, Store};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bullet.heap");
    {
        let heap = Heap::create(
            &path,
            &HeapOptions {
                size: 16 * MIB,
                geometry: Geometry {
                    nslots: 16,
                    ..Geometry::small()
                },
                reserve: 64 * MIB,
                ..Default::default()
            },
        )
        .unwrap();
        let st = BulletStore::create(
            &heap,
            &BulletOptions {
                logs: 4,
                log_size: 64 << 10,
                backend: BackendOptions {
                    buckets: 64,
                    ..Default::default()
                },
                frontend_buckets: 64,
                // No epoch ends during the test: nothing drains the logs behind it.
                epoch: std::time::Duration::from_secs(3600),
                ..Default::default()
            },
        )
        .unwrap();
        let mut s = st.session().unwrap();
        for i in 0..200 {
            s.apply(format!("k{i}").as_bytes(), Op::Put(b"v")).unwrap();
        }
        drop(s);
        st.drain().unwrap();
        let mut s = st.session().unwrap();
        for i in 0..50 {
            s.apply(format!("n{i}").as_bytes(), Op::Incr(i)).unwrap();
        }
        drop(s);
        st.close().unwrap();
    }
    let out = check(&path, true);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["structure"];
    assert_eq!(s["name"], "bullet", "{v}");
    assert_eq!(s["key_hash"], "siphash-1-3, keyed", "{v}");
    assert_eq!(s["keys"], 200, "{v}");
    assert!(s["logs"]["records"].as_u64().unwrap() >= 50, "{v}");
    assert_eq!(s["logs"]["unapplied"], 50, "{v}");
    assert_eq!(s["problems"].as_array().unwrap().len(), 0, "{v}");
    let human = assert_accepted(&path);
    assert!(human.contains("bullet"), "{human}");
}
