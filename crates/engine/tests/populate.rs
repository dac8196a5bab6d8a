//! Log pages mapped writable ahead of the writer (`Pool::populate_ahead`): the
//! appends into them take no page faults, laps are populated again, and nothing
//! in the log changes. Pages behind the head given back (`Pool::release_behind`):
//! out of the resident set, their bytes kept, mapped again for the next lap.

use engine::crl::{Pool, RecPtr, BACKEND_HASH};
use pmem::{Geometry, Heap, HeapOptions, PPtr};

/// Minor page faults this thread has taken so far.
fn thread_minor_faults() -> i64 {
    // SAFETY: `rusage` is plain C data, for which all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes the struct it is given, a live local.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) }, 0);
    ru.ru_minflt
}

const LOG: u64 = 1 << 20;

/// Appends 100-byte records to log `i` until `bytes` more are in it; returns the
/// minor faults taken meanwhile.
fn append(pool: &Pool, i: usize, bytes: u64, n: &mut u64) -> i64 {
    let start = pool.logs[i].tail.load(std::sync::atomic::Ordering::Acquire);
    let before = thread_minor_faults();
    loop {
        let tail = pool.logs[i].tail.load(std::sync::atomic::Ordering::Acquire);
        if tail - start >= bytes {
            break;
        }
        let key = format!("key:{n:08}");
        pool.append(i, 1, key.as_bytes(), &[7u8; 100], RecPtr(0), *n)
            .unwrap()
            .expect("room in the log");
        *n += 1;
    }
    thread_minor_faults() - before
}

/// The records of log `i` between positions `from` and `tail`, each of
/// which must check.
fn records(pool: &Pool, i: usize, mut pos: u64, tail: u64) -> u64 {
    let mut seen = 0;
    loop {
        pos = pool.skip_gap(pos).min(tail);
        if pos >= tail {
            return seen;
        }
        let h = pool.header(RecPtr::new(i, pos)).unwrap();
        seen += 1;
        pos += h.len as u64;
    }
}

/// A 32 MiB heap `name` in `d` with a pool of `logs` logs of `LOG` bytes (no
/// buffer yet), and the pool's descriptor.
fn new_pool(d: &std::path::Path, name: &str, logs: usize) -> (Heap, Pool, u64) {
    let o = HeapOptions {
        size: 32 << 20,
        geometry: Geometry::small(),
        ..Default::default()
    };
    let heap = Heap::create(&d.join(name), &o).unwrap();
    let desc = Pool::create_desc(&heap, logs, LOG, BACKEND_HASH, PPtr::from_raw(0)).unwrap();
    let pool = Pool::attach(&heap, desc).unwrap();
    (heap, pool, desc)
}

#[test]
fn populated_log_pages_take_no_faults_and_keep_their_records() {
    use std::sync::atomic::Ordering::Acquire;
    let d = tempfile::tempdir().unwrap();
    let (_heap, pool, _) = new_pool(d.path(), "h", 3);
    pool.ensure_buffer(0).unwrap();
    pool.ensure_buffer(1).unwrap();
    let mut n = 0;

    // Nothing appended yet: each log with a buffer is asked for `ahead` bytes;
    // a second call asks for nothing more.
    let asked = pool.populate_ahead(LOG / 2);
    if asked == 0 {
        eprintln!("populate: MADV_POPULATE_WRITE not supported by this kernel; skipped");
        return;
    }
    assert_eq!(asked, 2 * (LOG / 2));
    assert_eq!(pool.populate_ahead(LOG / 2), 0);

    // Appending a quarter of log 0 (populated) faults (almost) never.
    let pages = (LOG / 4 / 4096) as i64;
    let warm = append(&pool, 0, LOG / 4, &mut n);
    assert!(
        warm < pages / 8,
        "{warm} faults over {pages} populated pages"
    );
    let written = n;

    // Only what lies past the old watermark is asked for, capped at a whole
    // buffer past the tail: for log 0 that range crosses the end of the ring
    // (positions keep growing, so the next lap is populated again).
    let t0 = pool.logs[0].tail.load(Acquire);
    assert_eq!(
        pool.populate_ahead(2 * LOG),
        (t0 + LOG - LOG / 2) + (LOG - LOG / 2)
    );
    assert_eq!(pool.logs[0].populated.load(Acquire), t0 + LOG);

    // The comparison means something: a log nobody populated faults once a page.
    pool.ensure_buffer(2).unwrap();
    let cold = append(&pool, 2, LOG / 4, &mut n);
    assert!(
        cold >= pages / 2,
        "only {cold} faults over {pages} fresh pages"
    );

    // Every record of log 0 still checks, in order.
    let (head, tail) = (
        pool.logs[0].head.load(Acquire),
        pool.logs[0].tail.load(Acquire),
    );
    assert_eq!(
        records(&pool, 0, head, tail),
        written,
        "records lost or damaged by populate"
    );
}

#[test]
fn preallocate_gives_every_log_a_mapped_buffer_or_a_clear_error() {
    use std::sync::atomic::Ordering::Acquire;
    let d = tempfile::tempdir().unwrap();
    let (heap, pool, desc) = new_pool(d.path(), "h", 4);
    pool.preallocate().unwrap();
    let bases: Vec<u64> = pool.logs.iter().map(|l| l.base.load(Acquire)).collect();
    assert!(
        bases.iter().all(|&b| b != 0),
        "a log without a buffer: {bases:?}"
    );
    let mut sorted = bases.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 4, "two logs share a buffer: {bases:?}");
    // Each whole ring is populated: a lap of any log takes (almost) no fault.
    // (Without MADV_POPULATE_WRITE nothing is populated and nothing is asked.)
    if pool.logs.iter().all(|l| l.populated.load(Acquire) == 0) {
        eprintln!("populate: MADV_POPULATE_WRITE not supported by this kernel; skipped");
    } else {
        assert!(pool.logs.iter().all(|l| l.populated.load(Acquire) == LOG));
        assert_eq!(pool.populate_ahead(LOG), 0, "populated twice");
        let mut n = 0;
        let pages = (LOG / 2 / 4096) as i64;
        let faults = append(&pool, 3, LOG / 2, &mut n);
        assert!(
            faults < pages / 8,
            "{faults} faults over {pages} preallocated pages"
        );
    }
    // The buffers survive a reopen (their offsets are persistent).
    drop(pool);
    let pool = Pool::attach(&heap, desc).unwrap();
    let again: Vec<u64> = pool.logs.iter().map(|l| l.base.load(Acquire)).collect();
    assert_eq!(again, bases);

    // A heap too small for its logs: a configuration error naming them.
    let (_heap2, pool, _) = new_pool(d.path(), "h2", 64);
    let e = pool.preallocate().unwrap_err().to_string();
    assert!(e.contains("no room for 64 logs of 1048576 bytes"), "{e}");
}

/// Under msync, preallocation also writes the new buffers out (zeros), so
/// that a writer's first `msync` of a page does not also allocate its block:
/// every line of every ring is flushed and one fence syncs them. Under the
/// other strategies nothing is written out.
#[test]
fn preallocate_under_msync_writes_the_new_buffers_out() {
    let d = tempfile::tempdir().unwrap();
    for (strategy, name) in [
        (pmem::Strategy::Msync, "msync"),
        (pmem::Strategy::FenceOnly, "fence"),
    ] {
        let o = HeapOptions {
            size: 32 << 20,
            geometry: Geometry::small(),
            strategy,
            ..Default::default()
        };
        let heap = Heap::create(&d.path().join(name), &o).unwrap();
        let desc = Pool::create_desc(&heap, 3, LOG, BACKEND_HASH, PPtr::from_raw(0)).unwrap();
        let pool = Pool::attach(&heap, desc).unwrap();
        let before = heap.region().persist_stats();
        pool.preallocate().unwrap();
        let after = heap.region().persist_stats();
        let lines = after.flushes - before.flushes;
        if strategy == pmem::Strategy::Msync {
            assert!(lines >= 3 * LOG / 64, "{name}: {lines} lines flushed");
            assert!(after.msyncs > before.msyncs, "{name}: no msync");
        } else {
            assert!(lines < LOG / 64, "{name}: {lines} lines flushed");
        }
        // Written out or not, the logs work alike.
        let mut n = 0;
        append(&pool, 0, 4096, &mut n);
        assert!(pool.logs[0].tail.load(std::sync::atomic::Ordering::Acquire) >= 4096);
    }
}

/// Applied records' pages leave the process's resident set (a lap of every
/// log no longer stays resident for good), keep their bytes (the heap is a
/// shared file mapping), are not given back twice, and the next lap's
/// population maps them again. Pages the next lap already needs are kept.
#[test]
fn applied_log_pages_leave_the_resident_set_and_keep_their_bytes() {
    use std::sync::atomic::Ordering::{Acquire, Release};
    let d = tempfile::tempdir().unwrap();
    let (heap, pool, _) = new_pool(d.path(), "h", 1);
    pool.ensure_buffer(0).unwrap();
    let r = heap.region();
    let base = pool.logs[0].base.load(Acquire);
    let pages = LOG / 4096;
    if pool.populate_ahead(LOG) == 0 || r.resident_pages(base, LOG).is_none() {
        eprintln!("populate or /proc/self/pagemap not available here; skipped");
        return;
    }
    assert_eq!(r.resident_pages(base, LOG), Some(pages));
    let mut n = 0;
    append(&pool, 0, 3 * LOG / 4, &mut n);
    let tail = pool.logs[0].tail.load(Acquire);

    // Nothing applied yet: nothing to give back.
    assert_eq!(pool.release_behind(0), 0);
    assert_eq!(r.resident_pages(base, LOG), Some(pages));

    // Everything applied: the head moves to the tail, and the whole pages
    // behind it go (the one holding the head stays until the head passes it).
    pool.logs[0].head.store(tail, Release);
    pool.persist_heads(&[(0, tail)]);
    let given = pool.release_behind(0);
    assert_eq!(given, tail & !4095);
    assert_eq!(r.resident_pages(base, LOG), Some(pages - given / 4096));
    assert_eq!(pool.release_behind(0), 0, "given back twice");

    // The bytes are still there: every record written still checks.
    assert_eq!(records(&pool, 0, 0, tail), n, "records lost by the release");

    // The next lap maps them again ahead of the writer...
    pool.populate_ahead(LOG);
    assert_eq!(r.resident_pages(base, LOG), Some(pages));
    // ...and those are kept, now that the next lap needs them, when the head
    // moves on: only the newly applied records' pages go.
    append(&pool, 0, LOG / 8, &mut n);
    let tail2 = pool.logs[0].tail.load(Acquire);
    pool.logs[0].head.store(tail2, Release);
    pool.persist_heads(&[(0, tail2)]);
    assert_eq!(pool.release_behind(0), (tail2 & !4095) - tail);
    let kept = tail & !4095;
    assert_eq!(
        r.resident_pages(base, kept),
        Some(kept / 4096),
        "pages of the next lap given back"
    );

    // A log whose next lap was mapped before its records were applied keeps
    // those pages: giving them back would only make the writer fault.
    let (heap, pool, _) = new_pool(d.path(), "h2", 1);
    pool.ensure_buffer(0).unwrap();
    let r = heap.region();
    let base = pool.logs[0].base.load(Acquire);
    pool.populate_ahead(LOG);
    append(&pool, 0, 3 * LOG / 4, &mut n);
    let tail = pool.logs[0].tail.load(Acquire);
    pool.populate_ahead(LOG);
    pool.logs[0].head.store(tail, Release);
    pool.persist_heads(&[(0, tail)]);
    assert_eq!(pool.release_behind(0), 0, "next lap's pages given back");
    assert_eq!(r.resident_pages(base, LOG), Some(pages));
}

/// The advancer's pacing: an idle log keeps only `min` mapped ahead of its
/// tail, a busy one four times its appends since the last call, up to `max`.
#[test]
fn population_is_paced_by_each_logs_appends() {
    use std::sync::atomic::Ordering::Acquire;
    let d = tempfile::tempdir().unwrap();
    let (_heap, pool, _) = new_pool(d.path(), "h", 2);
    pool.ensure_buffer(0).unwrap();
    pool.ensure_buffer(1).unwrap();
    let (min, max) = (64 << 10, LOG / 2);
    if pool.populate_paced(min, max) == 0 {
        eprintln!("populate: MADV_POPULATE_WRITE not supported by this kernel; skipped");
        return;
    }
    assert!(pool.logs.iter().all(|l| l.populated.load(Acquire) == min));
    let mut n = 0;
    append(&pool, 0, 40 << 10, &mut n);
    pool.populate_paced(min, max);
    let t0 = pool.logs[0].tail.load(Acquire);
    assert_eq!(pool.logs[0].populated.load(Acquire), t0 + 4 * t0);
    assert_eq!(
        pool.logs[1].populated.load(Acquire),
        min,
        "an idle log grew"
    );
    append(&pool, 0, LOG / 4, &mut n);
    pool.populate_paced(min, max);
    let t1 = pool.logs[0].tail.load(Acquire);
    assert_eq!(pool.logs[0].populated.load(Acquire), t1 + max);
}
