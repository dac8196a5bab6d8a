//! Background threads and roles: static gleaners, dynamic gleaner roles and
//! their priorities, and the epoch advancer (§2.4, §4.3.2).

use super::glean::{Cut, Gleaner};
use super::Shared;
use crate::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How far past each log's tail the advancer maps pages writable every epoch
/// (`Pool::populate_paced`) at most: several epochs of appends at a million
/// puts a second per writer. Each log gets four epochs of its own recent
/// appends, at least `POPULATE_MIN`: an idle log's pages do not sit in the
/// resident set (8 logs × 8 MiB would be 64 MiB of RSS for nothing).
const POPULATE_AHEAD: u64 = 8 << 20;
const POPULATE_MIN: u64 = 1 << 20;

/// The least run of applied log behind a head that the advancer gives back
/// to the kernel at once (`Pool::release_behind`): each call costs a system
/// call and a TLB shootdown.
const RELEASE_MIN: u64 = 1 << 20;

/// A role thread (`role_gleaner`) as the advancer sees it.
#[derive(Default)]
pub(super) struct RoleSlot {
    /// The running thread's id (0 between threads). The advancer lowers a
    /// thread's priority holding this lock, which the thread takes to clear
    /// its id before it ends: the id is never that of a finished thread.
    tid: Mutex<i32>,
    /// In a batch with the role: the only time its priority is lowered.
    busy: AtomicBool,
    /// Its priority was lowered: it gives the role back after the batch and
    /// ends; its keeper starts a new thread at normal priority.
    lowered: AtomicBool,
}

/// A gleaner for a background thread (made on that thread: index handles stay on
/// the thread that made them).
fn thread_gleaner(sh: &Arc<Shared>, what: &str) -> Option<Gleaner> {
    match Gleaner::new(sh) {
        Ok(mut g) => {
            g.inline = false;
            Some(g)
        }
        Err(e) => {
            eprintln!("ember: {what} cannot start: {e}");
            None
        }
    }
}

/// Reports a background error once per kind of message, then backs off: a full
/// heap can empty again, so the thread keeps trying.
fn backoff(what: &str, e: &Error, last: &mut String) {
    let m = e.to_string();
    if *last != m {
        eprintln!("ember: {what}: {m} (retrying)");
        *last = m;
    }
    std::thread::sleep(Duration::from_millis(10));
}

/// Runs role thread `n` (`role_gleaner`), and a new one each time a thread
/// ends because its priority was lowered (a thread cannot raise its own
/// priority again without privileges; a new thread starts at this one's).
pub(super) fn role_keeper(sh: Arc<Shared>, n: usize) {
    let mut last = String::new();
    while !sh.stop.load(Ordering::Acquire) {
        let s = sh.clone();
        let t = std::thread::Builder::new()
            .name(format!("ember-gleaner-{n}"))
            .spawn(move || role_gleaner(s, n));
        match t {
            // Lowered: a new thread. Otherwise the store is closing, or the
            // thread could not start (its message is printed) or panicked: a
            // new one would fail the same way.
            Ok(t) => {
                if !matches!(t.join(), Ok(true)) {
                    return;
                }
            }
            Err(e) => backoff(
                "gleaner",
                &Error::Config(format!("cannot start a gleaner: {e}")),
                &mut last,
            ),
        }
    }
}

/// A background thread that takes a dynamic gleaner role when the advancer wants
/// one more gleaner and gives it back when it wants one fewer
/// (`BulletOptions::role_threads`). When the advancer wants one fewer while
/// the thread is in a batch, it lowers the thread's priority (`lower_roles`):
/// the batch ends (its backend writes must be made durable before its records
/// are flagged, with msync much of a second) at the priority of a background
/// task, out of the way of the requests, and the thread then ends. True when
/// it ended for that reason.
fn role_gleaner(sh: Arc<Shared>, n: usize) -> bool {
    let slot = &sh.roles[n];
    let Some(mut g) = thread_gleaner(&sh, "gleaner") else {
        return false;
    };
    g.cut = Cut::RoleWanted;
    *slot.tid.lock().unwrap_or_else(|e| e.into_inner()) = current_tid();
    let mut active = false;
    let mut last = String::new();
    while !sh.stop.load(Ordering::Acquire) && !slot.lowered.load(Ordering::Acquire) {
        let have = sh.gleaners.load(Ordering::Acquire);
        let target = sh.target.load(Ordering::Acquire);
        if !active {
            if have < target
                && sh
                    .gleaners
                    .compare_exchange(have, have + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                active = true;
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
            continue;
        }
        if have > target
            && sh
                .gleaners
                .compare_exchange(have, have - 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            active = false;
            g.release(&sh);
            continue;
        }
        slot.busy.store(true, Ordering::Release);
        let r = g.glean_batch(&sh);
        slot.busy.store(false, Ordering::Release);
        match r {
            Ok(true) => {}
            Ok(false) => std::thread::sleep(Duration::from_micros(100)),
            Err(e) => backoff("gleaner", &e, &mut last),
        }
    }
    *slot.tid.lock().unwrap_or_else(|e| e.into_inner()) = 0;
    let lowered = slot.lowered.swap(false, Ordering::AcqRel);
    if active {
        sh.gleaners.fetch_sub(1, Ordering::AcqRel);
    }
    g.retire(&sh);
    lowered
}

/// The calling thread's kernel id.
fn current_tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Lowers the priority of busy role threads, `excess` of them at most (the
/// advancer wants that many gleaners fewer than there are): each gives its
/// role back after its batch and ends (`role_gleaner`).
fn lower_roles(sh: &Shared, excess: usize) {
    // Lowered threads still in their batch count towards the excess.
    let lowered = sh
        .roles
        .iter()
        .filter(|s| s.lowered.load(Ordering::Acquire))
        .count();
    let mut excess = excess.saturating_sub(lowered);
    for slot in sh.roles.iter() {
        if excess == 0 {
            break;
        }
        let tid = slot.tid.lock().unwrap_or_else(|e| e.into_inner());
        if *tid == 0 || !slot.busy.load(Ordering::Acquire) || slot.lowered.load(Ordering::Acquire) {
            continue;
        }
        // Nice 19: CPU only when the serving threads leave some. Raising a
        // nice value needs no privilege; lowering it again would (hence a new
        // thread). A failure leaves the thread as it was.
        // SAFETY: setpriority has no memory preconditions; the id is a live
        // thread of this process (see `RoleSlot::tid`).
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, *tid as libc::id_t, 19) } == 0 {
            slot.lowered.store(true, Ordering::Release);
            sh.c.lowered.fetch_add(1, Ordering::Relaxed);
            excess -= 1;
        }
    }
}

pub(super) fn static_gleaner(sh: Arc<Shared>) {
    let Some(mut g) = thread_gleaner(&sh, "gleaner") else {
        return;
    };
    sh.gleaners.fetch_add(1, Ordering::AcqRel);
    let mut last = String::new();
    while !sh.stop.load(Ordering::Acquire) {
        match g.glean_batch(&sh) {
            Ok(true) => {}
            Ok(false) => std::thread::sleep(Duration::from_micros(100)),
            Err(e) => backoff("gleaner", &e, &mut last),
        }
    }
    sh.gleaners.fetch_sub(1, Ordering::AcqRel);
    g.retire(&sh);
}

/// Epochs in a row without a write after which a gleaner goes back to serving
/// (see `gleaners_wanted`).
const QUIET_EPOCHS: u32 = 3;

/// The number of gleaners the advancer wants after an epoch, from `t` (the
/// number it wanted before), `max` (threads that may glean), the log
/// occupancy now and one epoch ago, and `quiet` (epochs in a row in which
/// nothing was written; 0 = written this epoch).
///
/// §4.3.2: above 60% occupancy one more gleaner (while the occupancy still
/// grows), below 30% one fewer. And one refinement (the advancer applies it
/// with msync only; elsewhere `quiet` is always 0): `QUIET_EPOCHS` epochs in
/// a row in which nothing was written give a gleaner back, whatever the
/// occupancy. Logs that nobody writes cannot fill, and a read-only phase
/// should have every thread serving. The backlog waits for the next writes
/// (above 60%, a gleaner again at the first epoch with an append) or for an
/// idle spell (drained then). More than one epoch, so that a pause in the
/// writes (a slow `msync`) does not bounce the role.
fn gleaners_wanted(t: usize, max: usize, occ: f64, last_occ: f64, quiet: u32) -> usize {
    if occ > 0.6 && quiet == 0 && (t == 0 || occ > last_occ) {
        (t + 1).min(max)
    } else if (occ < 0.3 || quiet >= QUIET_EPOCHS) && t > 0 {
        t - 1
    } else {
        t.min(max)
    }
}

pub(super) fn advancer(sh: Arc<Shared>) {
    let Some(mut g) = thread_gleaner(&sh, "epoch advancer") else {
        return;
    };
    let g = &mut g;
    let mut last = String::new();
    let mut last_occ = 0.0;
    let mut last_ops = u64::MAX;
    let mut last_tails = sh.pool.appended_bytes();
    let mut last_waits = sh.c.waits.load(Ordering::Relaxed);
    let mut quiet = 0u32;
    // The §4.3.2 rule's number of gleaners (`target` may add an idle drain).
    let mut base = 0usize;
    while !sh.stop.load(Ordering::Acquire) {
        // Sleep out the epoch in short naps, so that closing the store does not
        // wait for a long epoch to end.
        let start = Instant::now();
        while !sh.stop.load(Ordering::Acquire) {
            let left = sh.opts.epoch.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(5)));
        }
        if sh.stop.load(Ordering::Acquire) {
            break;
        }
        sh.vtick.fetch_add(1, Ordering::AcqRel);
        sh.c.epochs.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = sh.advance() {
            backoff("epoch advancer", &e, &mut last);
            continue;
        }
        sh.pool.populate_paced(POPULATE_MIN, POPULATE_AHEAD);
        let given = sh.pool.release_behind(RELEASE_MIN);
        sh.c.released.fetch_add(given, Ordering::Relaxed);
        let (used, cap) = sh.pool.occupancy();
        // Against the backlog bound when there is one: gleaners are wanted
        // before writers reach it and wait.
        let occ = used as f64 / sh.backlog_capacity(cap) as f64;
        // Written this epoch: a record appended, or a writer found its log
        // full (and so appended nothing).
        let tails = sh.pool.appended_bytes();
        let waits = sh.c.waits.load(Ordering::Relaxed);
        if tails != last_tails || waits != last_waits {
            quiet = 0;
        } else {
            quiet = quiet.saturating_add(1);
        }
        last_tails = tails;
        last_waits = waits;
        // Idle: nobody served a request this epoch, so nobody is short of CPU.
        let ops = sh.c.ops.load(Ordering::Relaxed);
        let idle = ops == last_ops;
        if sh.opts.variant.dynamic() {
            let max = if sh.opts.role_threads > 0 {
                sh.opts.role_threads
            } else {
                sh.sessions.load(Ordering::Acquire).saturating_sub(1)
            };
            // The quiet rule only with msync, where gleaning during reads cost
            // the readers more than its own CPU: each page a batch writes out
            // is write-protected, a TLB shootdown (an IPI, a VM exit here) on
            // the serving cores. With the flush strategies a backlog applied
            // later costs as much as now, and the next writes would pay it.
            let msync = matches!(sh.pool.heap.region().strategy(), pmem::Strategy::Msync);
            let quiet = if msync { quiet } else { 0 };
            base = gleaners_wanted(base, max, occ, last_occ, quiet);
            // Idle with role threads: one of them drains the logs, with the
            // large batches of a background gleaner (restarts after an idle
            // period replay nothing); its priority is lowered as soon as
            // requests come in again.
            let nt = if idle && used > 0 && !sh.roles.is_empty() {
                base.max(1)
            } else {
                base
            };
            sh.target.store(nt, Ordering::Release);
            let have = sh.gleaners.load(Ordering::Acquire);
            if nt < have {
                lower_roles(&sh, have - nt);
            }
        }
        last_occ = occ;
        // Tombstones of an earlier epoch can go now.
        let pending = std::mem::take(&mut *sh.deferred.lock().unwrap_or_else(|e| e.into_inner()));
        let mut keep = Vec::new();
        for (h, k) in pending {
            if !sh.reap(h, &k) {
                keep.push((h, k));
            }
        }
        sh.deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(keep);
        // Idle without role threads: the advancer drains the logs itself.
        // It keeps gleaning, advancing heads once per epoch, until the logs are
        // empty or requests come in again.
        // Requests that come in wait for at most part of the batch under way:
        // the batches are a session's (with msync 2,048 records, not 16,384,
        // whose writeback is long enough to delay the requests that follow),
        // and the counter is checked before each group (`Cut`).
        if idle && used > 0 && sh.roles.is_empty() {
            let mut until = Instant::now() + sh.opts.epoch;
            g.inline = true;
            g.cut = Cut::Requests(ops);
            while !sh.stop.load(Ordering::Acquire) {
                match g.glean_batch(&sh) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        backoff("idle gleaning", &e, &mut last);
                        break;
                    }
                }
                if sh.c.ops.load(Ordering::Relaxed) != ops {
                    break;
                }
                if Instant::now() >= until {
                    let _ = sh.advance();
                    until = Instant::now() + sh.opts.epoch;
                }
            }
            g.inline = false;
            g.cut = Cut::Never;
        }
        last_ops = sh.c.ops.load(Ordering::Relaxed);
    }
    g.retire(&sh);
}

#[cfg(test)]
mod tests {
    use super::super::{BulletOptions, BulletStore};
    use super::*;
    use crate::direct::BackendOptions;
    use crate::{Op, Session, Store};
    use pmem::Heap;

    #[test]
    fn gleaners_wanted_follows_occupancy_and_writes() {
        // §4.3.2: above 60% and growing, one more (up to `max`).
        assert_eq!(gleaners_wanted(0, 2, 0.65, 0.0, 0), 1);
        assert_eq!(gleaners_wanted(1, 2, 0.70, 0.65, 0), 2);
        assert_eq!(gleaners_wanted(2, 2, 0.80, 0.70, 0), 2);
        // Above 60% but shrinking: as many as before.
        assert_eq!(gleaners_wanted(1, 2, 0.62, 0.65, 0), 1);
        // Between 30% and 60% with writes: as many as before.
        assert_eq!(gleaners_wanted(1, 2, 0.45, 0.50, 0), 1);
        // Below 30%: one fewer.
        assert_eq!(gleaners_wanted(2, 2, 0.20, 0.25, 0), 1);
        assert_eq!(gleaners_wanted(0, 2, 0.20, 0.25, 0), 0);
        // Fewer threads than gleaners wanted: capped.
        assert_eq!(gleaners_wanted(3, 1, 0.45, 0.50, 0), 1);
        // No writes for a few epochs: one fewer, whatever the occupancy, and
        // none added while nothing is written.
        for q in 1..QUIET_EPOCHS {
            assert_eq!(gleaners_wanted(1, 2, 0.90, 0.80, q), 1, "quiet {q}");
        }
        assert_eq!(gleaners_wanted(1, 2, 0.90, 0.90, QUIET_EPOCHS), 0);
        assert_eq!(gleaners_wanted(2, 2, 0.90, 0.90, QUIET_EPOCHS + 5), 1);
        assert_eq!(gleaners_wanted(0, 2, 0.95, 0.90, QUIET_EPOCHS), 0);
        assert_eq!(gleaners_wanted(0, 2, 0.95, 0.90, 1), 0);
    }

    fn heap(dir: &std::path::Path) -> Heap {
        Heap::create(&dir.join("h"), &crate::test_heap_opts(96 << 20, 256 << 20)).unwrap()
    }

    fn opts(epoch: Duration) -> BulletOptions {
        BulletOptions {
            logs: 4,
            log_size: 8 << 20,
            backend: BackendOptions {
                buckets: 1024,
                ..Default::default()
            },
            frontend_buckets: 1024,
            epoch,
            role_threads: 1,
            ..Default::default()
        }
    }

    fn until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        false
    }

    fn tid(sh: &Shared) -> i32 {
        *sh.roles[0].tid.lock().unwrap()
    }

    /// A role thread whose priority is lowered in a batch gives its role back
    /// after the batch and ends; its keeper starts another at normal priority,
    /// which takes the role again while it is wanted. Nothing is lost.
    #[test]
    fn a_lowered_role_thread_is_replaced_at_normal_priority() {
        let dir = tempfile::tempdir().unwrap();
        let heap = heap(dir.path());
        // No epoch ends during the test: `target` is the test's alone.
        let st = BulletStore::create(&heap, &opts(Duration::from_secs(3600))).unwrap();
        let sh = st.sh.clone();
        let stop = Arc::new(AtomicBool::new(false));
        const KEYS: u64 = 4000;
        let writer = {
            let st = st.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut s = st.session().unwrap();
                let mut i = 0u64;
                // Well within the logs (heads do not move without epochs).
                while i < 150_000 && !stop.load(Ordering::Acquire) {
                    let v = format!("value-{i:012}");
                    s.apply(format!("k{}", i % KEYS).as_bytes(), Op::Put(v.as_bytes()))
                        .unwrap();
                    i += 1;
                }
                i
            })
        };
        assert!(until(20, || tid(&sh) != 0), "no role thread");
        let first = tid(&sh);
        // SAFETY: getpriority has no memory preconditions.
        let nice = |t: i32| unsafe { libc::getpriority(libc::PRIO_PROCESS, t as libc::id_t) };
        // Normal priority is the process's (the test may run under `nice`):
        // this thread's, as threads inherit it (`0` names the calling thread).
        let normal = nice(0);
        assert_eq!(nice(first), normal);
        sh.target.store(1, Ordering::Release);
        assert!(
            until(20, || {
                if sh.roles[0].busy.load(Ordering::Acquire) {
                    lower_roles(&sh, 1);
                }
                sh.c.lowered.load(Ordering::Relaxed) == 1
            }),
            "the role thread was never caught in a batch"
        );
        // One lowered thread is enough for an excess of one.
        lower_roles(&sh, 1);
        assert_eq!(sh.c.lowered.load(Ordering::Relaxed), 1);
        assert!(
            until(20, || {
                let t = tid(&sh);
                t != 0 && t != first && sh.gleaners.load(Ordering::Acquire) == 1
            }),
            "no new role thread took the role"
        );
        let second = tid(&sh);
        assert_eq!(
            nice(second),
            normal,
            "the new thread runs at normal priority"
        );
        assert!(!sh.roles[0].lowered.load(Ordering::Acquire));
        stop.store(true, Ordering::Release);
        let n = writer.join().unwrap();
        assert!(n > 0);
        sh.target.store(0, Ordering::Release);
        assert!(until(20, || sh.gleaners.load(Ordering::Acquire) == 0));
        st.drain().unwrap();
        assert_eq!(st.log_occupancy_bytes().0, 0);
        // Every key holds its last value (the backend alone, logs empty).
        let mut s = st.session().unwrap();
        let mut out = Vec::new();
        for k in 0..KEYS.min(n) {
            let last = k + KEYS * ((n - 1 - k) / KEYS);
            assert!(s.get(format!("k{k}").as_bytes(), &mut out).unwrap());
            assert_eq!(out, format!("value-{last:012}").as_bytes(), "key {k}");
        }
        drop(s);
        st.verify().unwrap();
        st.close().unwrap();
    }

    /// With role threads, logs left with records when requests stop are
    /// drained in the background: a role thread takes the role for it and
    /// gives it back once the logs are empty.
    #[test]
    fn idle_logs_drain_on_a_role_thread() {
        let dir = tempfile::tempdir().unwrap();
        let heap = heap(dir.path());
        let st = BulletStore::create(&heap, &opts(Duration::from_millis(5))).unwrap();
        let sh = st.sh.clone();
        {
            let mut s = st.session().unwrap();
            for i in 0..30_000u64 {
                s.apply(format!("k{}", i % 3000).as_bytes(), Op::Incr(1))
                    .unwrap();
            }
        }
        assert!(
            until(30, || st.log_occupancy_bytes().0 == 0
                && sh.gleaners.load(Ordering::Acquire) == 0
                && sh.target.load(Ordering::Acquire) == 0),
            "idle logs were not drained: {:?}",
            st.stats()
        );
        assert_eq!(st.stats().records_applied, 30_000);
        let mut s = st.session().unwrap();
        let mut out = Vec::new();
        for k in 0..3000 {
            assert!(s.get(format!("k{k}").as_bytes(), &mut out).unwrap());
            assert_eq!(out, b"10");
        }
        drop(s);
        st.close().unwrap();
    }
}
