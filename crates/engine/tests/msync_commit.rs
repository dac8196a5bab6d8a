//! Group commit under msync on a real file: when a commit returns, every record
//! it acknowledges is synced, whatever fences the thread ran between staging
//! the records and the commit.
//!
//! Under msync a flush only queues the pages for the thread's next fence, and
//! staged records reach the file only at the commit's write through the file.
//! A fence between the two (a cross-log `make_durable`, a log hand-over, the
//! side-table transaction of the `st` variant) used to sync those pages while
//! they still held their old bytes; the commit's write then dirtied them again
//! and its own fence no longer covered them. The acknowledged records sat in the
//! page cache, lost on a power loss, though a SIGKILL image would hold them.
//!
//! The page cache says what a power loss would lose: `cachestat(2)` (Linux
//! 6.5 on) counts the dirty pages of a file range. After every commit here the
//! logs' rings hold none. The file must be on a file system with write-back
//! (not tmpfs): the tests use Cargo's target tmpdir and say so when they
//! cannot measure.

mod common;

use common::*;
use engine::bullet::{BulletOptions, BulletSession, BulletStore, Variant};
use engine::crl::{LOGS_OFF, LOG_DESC};
use engine::direct::BackendKind;
use engine::{Op, Session, Store};
use pmem::{Heap, Strategy as Persist};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

const LOG: u64 = 64 << 10;
const KIB: usize = 1024;

/// cachestat(2)'s number: 451 on every architecture (syscalls added since
/// Linux 5.1 share one numbering); this libc names it only for some targets.
const SYS_CACHESTAT: libc::c_long = 451;

/// `struct cachestat_range` of cachestat(2).
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// `struct cachestat` of cachestat(2).
#[repr(C)]
#[derive(Default, Debug)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Dirty page-cache pages of `[off, off+len)` of `file`; None when the kernel
/// has no cachestat.
fn dirty_pages(file: &std::fs::File, off: u64, len: u64) -> Option<u64> {
    let range = CachestatRange { off, len };
    let mut st = Cachestat::default();
    // SAFETY: both structs have the kernel's layout and live across the call.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut st as *mut Cachestat,
            0u32,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSYS), "cachestat: {e}");
        return None;
    }
    // Pages under write-back are not durable yet either.
    Some(st.nr_dirty + st.nr_writeback)
}

/// A directory on a file system with write-back, or None (tmpfs, ramfs).
fn disk_dir() -> Option<tempfile::TempDir> {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let c = std::ffi::CString::new(d.path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `statfs` is plain C data, for which all zeroes is a valid value.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `s` is a
    // live struct the call only fills in.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut s) }, 0);
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let t = s.f_type as i64;
    if t == TMPFS_MAGIC || t == RAMFS_MAGIC {
        eprintln!("skipped: {} has no write-back", d.path().display());
        return None;
    }
    Some(d)
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: BulletStore,
    file: std::fs::File,
}

fn opts(variant: Variant, logs: usize) -> BulletOptions {
    BulletOptions {
        logs,
        group_commit: true,
        // No gleaner: nothing but the sessions under test syncs anything
        // (a gleaner's msync of flags or backend pages may span a ring and
        // write its pages out by chance).
        static_gleaners: 0,
        role_threads: 0,
        epoch: Duration::from_millis(50),
        ..bullet_opts(variant, BackendKind::LogFree, LOG)
    }
}

fn fixture(variant: Variant, logs: usize) -> Option<Fixture> {
    let dir = disk_dir()?;
    let path = dir.path().join("heap");
    let heap = Heap::create(&path, &heap_opts(16 << 20, 16 << 20, Persist::Msync)).unwrap();
    let store = BulletStore::create(&heap, &opts(variant, logs)).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    dirty_pages(&file, 0, 0)?;
    Some(Fixture {
        _dir: dir,
        store,
        file,
    })
}

impl Fixture {
    /// Dirty pages in the logs' rings (records only: not the applied flags
    /// behind each ring, nor the backend).
    fn dirty_in_rings(&self) -> u64 {
        let heap = self.store.heap();
        let r = heap.region();
        let desc = heap.root().raw();
        let nlogs: u32 = r.read(desc + 8);
        let size: u64 = r.read(desc + 16);
        (0..nlogs as u64)
            .map(|i| {
                let base: u64 = r.read(desc + LOGS_OFF + i * LOG_DESC);
                assert_ne!(base, 0, "preallocated");
                dirty_pages(&self.file, base, size).unwrap()
            })
            .sum()
    }

    fn session(&self) -> BulletSession {
        self.store.session().unwrap()
    }

    /// Closes the store (its sessions are gone) and returns the directory.
    fn close(self) -> tempfile::TempDir {
        self.store.close().unwrap();
        drop(self.store);
        self._dir
    }
}

fn put(s: &mut BulletSession, key: &str, len: usize, fill: u8) {
    s.apply(key.as_bytes(), Op::Put(&vec![fill; len])).unwrap();
}

/// Reopens the heap (after a clean close) and checks each key's value.
fn check_reopened(path: &Path, variant: Variant, logs: usize, want: &[(&str, usize, u8)]) {
    let rec = Heap::open(path, &heap_opts(16 << 20, 16 << 20, Persist::Msync)).unwrap();
    let (store, _) = BulletStore::open(rec, &opts(variant, logs)).unwrap();
    let mut s = store.session().unwrap();
    let mut out = Vec::new();
    for &(k, len, fill) in want {
        assert!(s.get(k.as_bytes(), &mut out).unwrap(), "{k} lost");
        assert_eq!(out, vec![fill; len], "{k}");
    }
    drop(s);
    store.close().unwrap();
}

/// Two writers of one hot key: the second's put makes the first's record
/// durable (`make_durable`, a fence on the second's thread) after the second
/// staged a multi-page record of its own. Its commit must still sync that
/// record.
#[test]
fn a_cross_log_make_durable_does_not_leave_the_batch_unsynced() {
    let Some(f) = fixture(Variant::Full, 4) else {
        return;
    };
    let (mut a, mut b) = (f.session(), f.session());
    put(&mut a, "hot", 100, 1);
    put(&mut b, "big", 12 * KIB, 2);
    put(&mut b, "hot", 100, 3);
    b.commit().unwrap();
    a.commit().unwrap();
    assert_eq!(f.dirty_in_rings(), 0, "acknowledged records not synced");

    // The same with the commit detached (the pipelined group commit).
    put(&mut a, "hot", 100, 4);
    put(&mut b, "big2", 12 * KIB, 5);
    put(&mut b, "hot", 100, 6);
    let pending = b.commit_detached().unwrap().expect("a batch");
    pending.complete().unwrap();
    a.commit().unwrap();
    assert_eq!(f.dirty_in_rings(), 0, "acknowledged records not synced");
    drop((a, b));
    let dir = f.close();
    check_reopened(
        &dir.path().join("heap"),
        Variant::Full,
        4,
        &[("big", 12 * KIB, 2), ("big2", 12 * KIB, 5), ("hot", 100, 6)],
    );
}

/// A writer whose log fills takes over a log whose previous writer has not
/// committed: it makes that log durable first (a fence on its thread), after
/// it staged records in its old log. Its commit must still sync those.
#[test]
fn a_log_hand_over_does_not_leave_the_batch_unsynced() {
    let Some(f) = fixture(Variant::Full, 3) else {
        return;
    };
    let (mut s, mut t) = (f.session(), f.session());
    // s takes a log and fills most of it; t takes another and fills less
    // of it, then moves to the third log with a record that does not fit.
    put(&mut s, "s0", 50 * KIB, 1);
    put(&mut t, "t0", 40 * KIB, 2);
    put(&mut t, "t1", 30 * KIB, 3);
    // Fits only in t's first log, which t left uncommitted.
    put(&mut s, "s1", 20 * KIB, 4);
    s.commit().unwrap();
    t.commit().unwrap();
    assert_eq!(f.dirty_in_rings(), 0, "acknowledged records not synced");
    drop((s, t));
    let dir = f.close();
    check_reopened(
        &dir.path().join("heap"),
        Variant::Full,
        3,
        &[
            ("s0", 50 * KIB, 1),
            ("s1", 20 * KIB, 4),
            ("t0", 40 * KIB, 2),
            ("t1", 30 * KIB, 3),
        ],
    );
}

/// The `st` variant's put runs a side-table transaction (fences) after
/// staging its record: the commit must still sync the record.
#[test]
fn a_side_table_transaction_does_not_leave_the_batch_unsynced() {
    let Some(f) = fixture(Variant::St, 2) else {
        return;
    };
    let mut s = f.session();
    put(&mut s, "a", 12 * KIB, 1);
    put(&mut s, "b", 9 * KIB, 2);
    s.commit().unwrap();
    assert_eq!(f.dirty_in_rings(), 0, "acknowledged records not synced");
    drop(s);
    let dir = f.close();
    check_reopened(
        &dir.path().join("heap"),
        Variant::St,
        2,
        &[("a", 12 * KIB, 1), ("b", 9 * KIB, 2)],
    );
}

/// After a restart a frontend miss reads the backend, and a read that meets a
/// link still marked DIRTY (a crash between a backend write's CAS and its
/// flush) persists it: a flush and a fence on the reader's thread. Here that
/// read comes between a staged put and its commit; the commit must still
/// sync the put's record. The DIRTY mark is planted in the closed heap file,
/// on the value link of the key's backend node.
#[test]
fn a_backend_read_settling_a_dirty_link_does_not_leave_the_batch_unsynced() {
    let Some(dir) = disk_dir() else {
        return;
    };
    let path = dir.path().join("heap");
    let cold = "cold-key-0123";
    {
        let heap = Heap::create(&path, &heap_opts(16 << 20, 16 << 20, Persist::Msync)).unwrap();
        let store = BulletStore::create(&heap, &opts(Variant::Full, 2)).unwrap();
        let mut s = store.session().unwrap();
        put(&mut s, cold, 100, 7);
        s.commit().unwrap();
        drop(s);
        store.drain().unwrap();
        store.close().unwrap();
    }
    // The backend node of `cold`: tag "EHND", key length, key at 32; its
    // value link (at 24) gets the DIRTY mark (bit 1). Written in place and
    // synced: rewriting the whole file would leave pages of the page cache
    // dirty that the test then counts.
    let img = std::fs::read(&path).unwrap();
    let mut node = [0u8; 8];
    node[..4].copy_from_slice(b"EHND");
    node[4..].copy_from_slice(&(cold.len() as u32).to_le_bytes());
    let at = (0..img.len() - 64)
        .step_by(16)
        .find(|&i| img[i..i + 8] == node && img[i + 32..i + 32 + cold.len()] == *cold.as_bytes())
        .expect("the key's backend node");
    let link = u64::from_le_bytes(img[at + 24..at + 32].try_into().unwrap());
    assert_ne!(link, 0);
    {
        use std::os::unix::fs::FileExt;
        let w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        w.write_all_at(&(link | 2).to_le_bytes(), at as u64 + 24)
            .unwrap();
        w.sync_all().unwrap();
    }

    let rec = Heap::open(&path, &heap_opts(16 << 20, 16 << 20, Persist::Msync)).unwrap();
    let (store, _) = BulletStore::open(rec, &opts(Variant::Full, 2)).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let f = Fixture {
        _dir: dir,
        store,
        file,
    };
    let mut s = f.session();
    assert_eq!(f.dirty_in_rings(), 0);
    let fences = f.store.heap().region().persist_stats().fences;
    put(&mut s, "big", 12 * KIB, 1);
    let mut out = Vec::new();
    assert!(s.get(cold.as_bytes(), &mut out).unwrap());
    assert_eq!(out, vec![7; 100]);
    assert!(
        f.store.heap().region().persist_stats().fences > fences,
        "the backend read fenced (the planted mark was settled)"
    );
    s.commit().unwrap();
    assert_eq!(f.dirty_in_rings(), 0, "acknowledged records not synced");
    drop(s);
    let dir = f.close();
    check_reopened(
        &dir.path().join("heap"),
        Variant::Full,
        2,
        &[(cold, 100, 7), ("big", 12 * KIB, 1)],
    );
}
