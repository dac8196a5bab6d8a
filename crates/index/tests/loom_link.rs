//! Loom models of link-and-persist (`index::link`) and the link cache
//! (`index::lcache`), log-free paper §3–§4, run against the real code through a
//! model of persistent memory.
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p index --test loom_link --release`.
//!
//! The memory model ([`Mem`]): each modeled word (addresses 8, 16, 24, ...) is a
//! loom `AtomicU64` (the cache-coherent, visible value: loads may be stale as the
//! memory model allows), its modification history (outside loom, in a `std`
//! mutex: appended right after each successful CAS, with no loom operation in
//! between, so its order is the word's modification order) and its durable
//! version (an index into that history: what the medium holds).
//!
//! The durable version is a loom `AtomicUsize`, only ever accessed with relaxed
//! read-modify-writes (`fetch_max`): an RMW reads the latest value (no stale
//! reads, so "durable now" means durable in real time) and adds no
//! happens-before edge between the threads under test. It must be a loom object:
//! loom only preempts a thread at loom operations and its partial-order reduction
//! only reorders operations on a common object, so a fence that touched only
//! `std` state would run glued to the CAS before it, and a check "is it durable
//! yet" would never be ordered before a fence that it depends on (a first version
//! of this harness kept `durable` in the mutex and missed a settle that cleared
//! DIRTY before its fence).
//!
//! `flush(addr)` records a pending write-back for the calling thread (each thread
//! has its own `Mem` view, so "this thread's flushes" needs no thread id);
//! `fence()` makes this thread's pending write-backs durable. Which value a
//! write-back carries: on x86 `clwb` writes back whatever the line holds when the
//! write-back happens, anywhere between the flush and the fence's completion. The
//! default model ([`Wb::AtFlush`]) takes the latest value at flush time, the
//! earliest (so least durable) one possible; [`Wb::AtFence`] takes the latest at
//! fence time. Durability only grows (`durable = max(durable, written back)`: two
//! write-backs of one line are ordered by coherence, and the later one carries the
//! later value), so every "must be durable" property that holds under `AtFlush`
//! holds under `AtFence` and any write-back time in between; the models check the
//! stronger `AtFlush` (model 1 also runs `AtFence`). Spontaneous evictions only add
//! durability, so they cannot break these properties either.
//!
//! A property "`new` is durable" holds when the durable version is the version
//! that installed `new` (with or without DIRTY: recovery strips the mark) or a
//! later one.
#![cfg(loom)]

use index::lcache::{Added, LinkCache};
use index::link::{self, LinkMem, DIRTY};
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use std::cell::RefCell;
use std::sync::Mutex;

/// When a write-back reads the line (see the module note).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wb {
    AtFlush,
    AtFence,
}

/// Link values (pointers: the mark bits are clear).
const OLD: u64 = 0x100;
const NEW: u64 = 0x200;
const NEWER: u64 = 0x300;
const NEW2: u64 = 0x400;
/// Nodes the links concern (the cache hashes them; one bucket: all collide).
const NODE_A: u64 = 0x1000;
const NODE_B: u64 = 0x2000;
/// The main thread's writer id (setup and final checks).
const MAIN: usize = 0;

struct Shared {
    /// Per word: the visible value.
    vis: Vec<AtomicU64>,
    /// Per word: (value, writer) in modification order; [0] is the initial value.
    hist: Mutex<Vec<Vec<(u64, usize)>>>,
    /// Per word: index in `hist` of the durable version.
    durable: Vec<AtomicUsize>,
    wb: Wb,
}

fn slot(addr: u64) -> usize {
    assert!(addr & 7 == 0 && addr >= 8, "bad modeled address {addr}");
    (addr / 8 - 1) as usize
}

impl Shared {
    /// Words at 8, 16, ... holding `init` (durable).
    fn new(init: &[u64], wb: Wb) -> Arc<Shared> {
        Arc::new(Shared {
            vis: init.iter().map(|&v| AtomicU64::new(v)).collect(),
            hist: Mutex::new(init.iter().map(|&v| vec![(v, MAIN)]).collect()),
            durable: init.iter().map(|_| AtomicUsize::new(0)).collect(),
            wb,
        })
    }

    fn latest(&self, addr: u64) -> usize {
        self.hist.lock().unwrap()[slot(addr)].len() - 1
    }

    /// `new` (or a later version of the word) is durable.
    #[track_caller]
    fn assert_durable(&self, addr: u64, new: u64, what: &str) {
        let d = self.durable[slot(addr)].fetch_max(0, Ordering::Relaxed);
        let h = self.hist.lock().unwrap();
        let vs = &h[slot(addr)];
        let Some(k) = vs.iter().position(|&(v, _)| v & !DIRTY == new) else {
            panic!("{what}: {new:#x} was never written at {addr} ({vs:x?})");
        };
        assert!(
            d >= k,
            "{what}: {new:#x} at {addr} is not durable: durable {:#x} (version {d}), \
             {new:#x} is version {k}; history {vs:x?}",
            vs[d].0
        );
    }

    /// Whether `who` ever wrote the word.
    fn wrote(&self, addr: u64, who: usize) -> bool {
        self.hist.lock().unwrap()[slot(addr)]
            .iter()
            .skip(1)
            .any(|&(_, w)| w == who)
    }

    fn history(&self, addr: u64) -> Vec<u64> {
        self.hist.lock().unwrap()[slot(addr)]
            .iter()
            .map(|&(v, _)| v)
            .collect()
    }
}

/// A thread's view of the memory (`who` tags its writes).
fn mem(sh: &Arc<Shared>, who: usize) -> Mem {
    Mem {
        sh: sh.clone(),
        who,
        pending: RefCell::new(Vec::new()),
    }
}

/// One thread's view of the modeled memory.
struct Mem {
    sh: Arc<Shared>,
    who: usize,
    /// Pending write-backs: (addr, version written back, when `Wb::AtFlush`).
    pending: RefCell<Vec<(u64, usize)>>,
}

impl LinkMem for Mem {
    fn load(&self, addr: u64) -> u64 {
        self.sh.vis[slot(addr)].load(Ordering::Acquire)
    }

    fn cas(&self, addr: u64, old: u64, new: u64) -> bool {
        let ok = self.sh.vis[slot(addr)]
            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        // No loom operation between the CAS and this: the history's order is the
        // word's modification order.
        if ok {
            self.sh.hist.lock().unwrap()[slot(addr)].push((new, self.who));
        }
        ok
    }

    fn flush(&self, addr: u64) {
        if addr == 0 || addr & 7 != 0 || slot(addr) >= self.sh.vis.len() {
            // Not a modeled word (e.g. a stale entry address): writes back nothing
            // the properties look at.
            return;
        }
        let k = self.sh.latest(addr);
        self.pending.borrow_mut().push((addr, k));
    }

    fn fence(&self) {
        // (Never hold the `std` mutex across a loom operation: loom may switch
        // threads there.)
        let pending: Vec<_> = self.pending.borrow_mut().drain(..).collect();
        for (addr, k) in pending {
            let k = match self.sh.wb {
                Wb::AtFlush => k,
                // The latest before this write-back's loom step: if loom switches
                // threads first, an earlier point between flush and fence.
                Wb::AtFence => self.sh.latest(addr),
            };
            self.sh.durable[slot(addr)].fetch_max(k, Ordering::Relaxed);
        }
    }
}

/// Runs a model with a preemption bound (unless `LOOM_MAX_PREEMPTIONS` is set;
/// loom takes at most 255) and reports how many executions loom explored.
/// `None`: exhaustive.
fn check<F: Fn() + Sync + Send + 'static>(name: &str, bound: Option<usize>, f: F) {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let mut b = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        b.preemption_bound = bound;
    }
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    b.check(move || {
        r.fetch_add(1, Relaxed);
        f()
    });
    eprintln!(
        "{name}: {} executions (preemption bound {:?})",
        runs.load(Relaxed),
        b.preemption_bound
    );
}

/// What the link layer's caller does (`LfHash::link`): through the cache when it
/// has room, else link-and-persist. Returns the cache's answer and whether the
/// link now holds `new` thanks to this call.
fn link_or_persist(
    lc: &LinkCache,
    m: &Mem,
    node: u64,
    addr: u64,
    old: u64,
    new: u64,
) -> (Added, bool) {
    match lc.try_link(m, node, addr, old, new).0 {
        Added::Linked => (Added::Linked, true),
        Added::CasFailed => (Added::CasFailed, false),
        Added::NoRoom => (Added::NoRoom, link::cas_persist(m, addr, old, new)),
    }
}

/// After everything: flush the whole cache; the bucket is then empty: all
/// `ENTRIES` entries can be reserved again (no entry leaked pending or busy).
fn drain_and_check_capacity(sh: &Arc<Shared>, lc: &LinkCache, spare: u64) {
    let m = mem(sh, MAIN);
    lc.flush_all(&m);
    assert_eq!(lc.busy(), 0, "busy entries left after flush_all");
    let mut cur = m.load(spare);
    for i in 0..index::lcache::ENTRIES {
        let next = (cur & !DIRTY) + 0x1000;
        let (r, _) = lc.try_link(&m, NODE_A, spare, cur & !DIRTY, next);
        assert_eq!(r, Added::Linked, "entry {i} of an idle bucket not free");
        cur = next;
    }
    let (r, _) = lc.try_link(&m, NODE_A, spare, cur, cur + 0x1000);
    assert_eq!(r, Added::NoRoom, "a full bucket took a seventh entry");
    lc.flush_all(&m);
    assert_eq!(lc.busy(), 0);
    sh.assert_durable(spare, cur, "spare link after the capacity check");
}

/// A model's threads, each a role.
type Role = Box<dyn FnOnce() + Send>;

/// Runs `roles` concurrently and waits for them: the first (in the chosen order)
/// on the model's main thread, the others spawned in order. Loom's first
/// execution runs them one after the other in that order; `rev` reverses it (see
/// the note on loom below). A panic of the main thread's role is held until the
/// others are joined: unwinding through live loom threads would abort the whole
/// test binary.
fn run_roles(rev: bool, mut roles: Vec<Role>) {
    if rev {
        roles.reverse();
    }
    let mut it = roles.into_iter();
    let first = it.next().expect("no role");
    let spawned: Vec<_> = it.map(thread::spawn).collect();
    let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(first));
    let mut theirs = None;
    for t in spawned {
        if let Err(e) = t.join() {
            theirs.get_or_insert(e);
        }
    }
    if let Some(e) = mine.err().or(theirs) {
        std::panic::resume_unwind(e);
    }
}

/// Results the roles report to the final checks (outside loom).
type Out = std::sync::Arc<Mutex<Vec<Option<(Added, bool)>>>>;

fn out(n: usize) -> Out {
    std::sync::Arc::new(Mutex::new(vec![None; n]))
}

// Note on loom (0.7.2): its partial-order reduction only remembers the last
// access to an atomic, so when thread X loads a location and thread Y then loads
// and writes it, the race between X's load and Y's write is never explored
// (tokio-rs/loom#166, #392: e.g. a flusher's first look at the bucket, then an
// inserter's reservation). The models therefore run twice (but `AtFence`), their
// roles in one order and in the reverse one: each pair of roles then meets in
// both orders in loom's first execution, and the write-before-load race is
// explored from the other side. This narrows the hole without closing it. With
// loom patched so that loads depend on the last access too
// (`rt::atomic::State::last_dependent_access` returning `last_access` for every
// action), the same models pass and catch the same broken variants of the
// protocol.

// ---------------------------------------------------------------------------
// 1. Link-and-persist with helping.

/// Writer A: `cas_persist(OLD → NEW)`; readers B and C load the link and settle
/// it. Whoever installed or observed NEW finds it durable when its operation
/// returns; the link ends clean.
fn lp_helping(wb: Wb, rev: bool) {
    check(
        &format!("lp_helping({wb:?}, rev {rev})"),
        Some(4),
        move || {
            let sh = Shared::new(&[OLD], wb);
            let sa = sh.clone();
            let a: Role = Box::new(move || {
                let m = mem(&sa, 1);
                assert!(link::cas_persist(&m, 8, OLD, NEW));
                sa.assert_durable(8, NEW, "writer A after cas_persist");
            });
            let reader = |sh: Arc<Shared>, who: usize| -> Role {
                Box::new(move || {
                    let m = mem(&sh, who);
                    let v = link::load_settled(&m, 8);
                    assert!(v == OLD || v == NEW, "reader saw {v:#x}");
                    if v == NEW {
                        sh.assert_durable(8, NEW, "reader after load_settled");
                    }
                })
            };
            run_roles(rev, vec![a, reader(sh.clone(), 2), reader(sh.clone(), 3)]);
            let v = mem(&sh, MAIN).load(8);
            assert_eq!(v, NEW, "link ends {v:#x}, history {:x?}", sh.history(8));
            sh.assert_durable(8, NEW, "end");
        },
    );
}

#[test]
fn lp_helping_wb_at_flush() {
    lp_helping(Wb::AtFlush, false);
}

#[test]
fn lp_helping_wb_at_flush_rev() {
    lp_helping(Wb::AtFlush, true);
}

#[test]
fn lp_helping_wb_at_fence() {
    lp_helping(Wb::AtFence, false);
}

/// Two dependent writers: A `cas_persist(OLD → NEW)`; B reads the link settled
/// and, if it holds NEW, `cas_persist(NEW → NEWER)` (A's clear of DIRTY may fail:
/// B settled NEW before changing it); reader C. Each finds what it installed or
/// observed (or later) durable; the link ends clean.
fn lp_dependent_writers(rev: bool) {
    check(
        &format!("lp_dependent_writers(rev {rev})"),
        Some(3),
        move || {
            let sh = Shared::new(&[OLD], Wb::AtFlush);
            let sa = sh.clone();
            let a: Role = Box::new(move || {
                let m = mem(&sa, 1);
                assert!(link::cas_persist(&m, 8, OLD, NEW));
                sa.assert_durable(8, NEW, "writer A after cas_persist");
            });
            let sb = sh.clone();
            let b: Role = Box::new(move || {
                let m = mem(&sb, 2);
                let v = link::load_settled(&m, 8);
                if v == NEW {
                    sb.assert_durable(8, NEW, "writer B's read");
                    assert!(link::cas_persist(&m, 8, NEW, NEWER), "B's CAS failed");
                    sb.assert_durable(8, NEWER, "writer B after cas_persist");
                } else {
                    assert_eq!(v, OLD);
                }
            });
            let sc = sh.clone();
            let c: Role = Box::new(move || {
                let m = mem(&sc, 3);
                let v = link::load_settled(&m, 8);
                if v != OLD {
                    sc.assert_durable(8, v, "reader C after load_settled");
                }
            });
            run_roles(rev, vec![a, b, c]);
            let v = mem(&sh, MAIN).load(8);
            assert_eq!(v & DIRTY, 0, "link ends DIRTY: {:x?}", sh.history(8));
            sh.assert_durable(8, v, "end");
        },
    );
}

#[test]
fn lp_dependent_writers_fwd() {
    lp_dependent_writers(false);
}

#[test]
fn lp_dependent_writers_rev() {
    lp_dependent_writers(true);
}

// ---------------------------------------------------------------------------
// 2. The link cache: pending/busy protocol, scan, flush_buckets.

/// A: `try_link(OLD → NEW)` (link-and-persist when NoRoom); readers B and C read
/// the link, settle it if DIRTY, then `scan` the node: if they saw NEW, NEW is
/// durable when the scan returns. At the end the cache drains cleanly.
fn lc_scan_after_read(rev: bool) {
    check(
        &format!("lc_scan_after_read(rev {rev})"),
        Some(2),
        move || {
            let sh = Shared::new(&[OLD, 0], Wb::AtFlush);
            let lc = Arc::new(LinkCache::new(1));
            let (sa, la) = (sh.clone(), lc.clone());
            let a: Role = Box::new(move || {
                let m = mem(&sa, 1);
                let (r, ok) = link_or_persist(&la, &m, NODE_A, 8, OLD, NEW);
                assert!(ok, "A failed: {r:?}");
                if r != Added::Linked {
                    sa.assert_durable(8, NEW, "A after cas_persist");
                }
            });
            let reader = |sh: Arc<Shared>, lc: Arc<LinkCache>, who: usize| -> Role {
                Box::new(move || {
                    let m = mem(&sh, who);
                    let v = link::load_settled(&m, 8);
                    lc.scan(&m, NODE_A);
                    if v == NEW {
                        sh.assert_durable(8, NEW, "reader after settle + scan");
                    } else {
                        assert_eq!(v, OLD);
                    }
                })
            };
            let (b, c) = (
                reader(sh.clone(), lc.clone(), 2),
                reader(sh.clone(), lc.clone(), 3),
            );
            run_roles(rev, vec![a, b, c]);
            assert_eq!(mem(&sh, MAIN).load(8), NEW, "{:x?}", sh.history(8));
            drain_and_check_capacity(&sh, &lc, 16);
            sh.assert_durable(8, NEW, "end");
        },
    );
}

#[test]
fn lc_scan_after_read_fwd() {
    lc_scan_after_read(false);
}

#[test]
fn lc_scan_after_read_rev() {
    lc_scan_after_read(true);
}

/// A busy entry (link 16, cached before the threads start), then A:
/// `try_link(OLD → NEW)` at 8 and, if Linked, publishes it and syncs
/// (`flush_buckets` of its bucket) while C runs `flush_buckets`. After each
/// flush, every link that was Linked before the flush began is durable.
fn lc_flush_buckets(rev: bool) {
    check(
        &format!("lc_flush_buckets(rev {rev})"),
        Some(4),
        move || {
            let sh = Shared::new(&[OLD, OLD, 0], Wb::AtFlush);
            let lc = Arc::new(LinkCache::new(1));
            {
                let m = mem(&sh, MAIN);
                assert_eq!(lc.try_link(&m, NODE_B, 16, OLD, NEW2).0, Added::Linked);
            }
            let linked = Arc::new(AtomicBool::new(false));
            let (sa, la, fa) = (sh.clone(), lc.clone(), linked.clone());
            let a: Role = Box::new(move || {
                let m = mem(&sa, 1);
                let (r, bi) = la.try_link(&m, NODE_A, 8, OLD, NEW);
                match r {
                    Added::Linked => {
                        fa.store(true, Ordering::Release);
                        la.flush_buckets(&m, 1 << bi);
                        sa.assert_durable(8, NEW, "A after its sync");
                        sa.assert_durable(16, NEW2, "A after its sync (older entry)");
                    }
                    Added::NoRoom => {
                        assert!(link::cas_persist(&m, 8, OLD, NEW));
                        sa.assert_durable(8, NEW, "A after cas_persist");
                    }
                    Added::CasFailed => panic!("A's CAS failed"),
                }
            });
            let (sc, lcc) = (sh.clone(), lc.clone());
            let c: Role = Box::new(move || {
                let m = mem(&sc, 2);
                let saw = linked.load(Ordering::Acquire);
                lcc.flush_buckets(&m, 1);
                sc.assert_durable(16, NEW2, "C after flush_buckets (older entry)");
                if saw {
                    sc.assert_durable(8, NEW, "C after flush_buckets (A's entry)");
                }
            });
            run_roles(rev, vec![a, c]);
            drain_and_check_capacity(&sh, &lc, 24);
            sh.assert_durable(8, NEW, "end");
        },
    );
}

#[test]
fn lc_flush_buckets_fwd() {
    lc_flush_buckets(false);
}

#[test]
fn lc_flush_buckets_rev() {
    lc_flush_buckets(true);
}

/// An inserter: link-and-persist fallback on NoRoom; reports (answer, success).
fn inserter(
    sh: &Arc<Shared>,
    lc: &Arc<LinkCache>,
    o: &Out,
    who: usize,
    node: u64,
    addr: u64,
    new: u64,
) -> Role {
    let (sh, lc, o) = (sh.clone(), lc.clone(), o.clone());
    Box::new(move || {
        let m = mem(&sh, who);
        let (r, ok) = link_or_persist(&lc, &m, node, addr, OLD, new);
        if ok && r == Added::NoRoom {
            sh.assert_durable(addr, new, "inserter after cas_persist");
        }
        if !ok {
            assert!(
                !sh.wrote(addr, who),
                "{r:?} changed the link: {:x?}",
                sh.history(addr)
            );
        }
        o.lock().unwrap()[who] = Some((r, ok));
    })
}

/// Two inserters on different links compete for the same bucket's entries while
/// a flusher runs: no entry is freed before its link is durable (after one final
/// `flush_all`, every Linked link is durable), and the bucket drains.
fn lc_two_inserters_and_flusher(rev: bool) {
    check(
        &format!("lc_two_inserters_and_flusher(rev {rev})"),
        Some(3),
        move || {
            let sh = Shared::new(&[OLD, OLD, 0], Wb::AtFlush);
            let lc = Arc::new(LinkCache::new(1));
            let o = out(3);
            let t1 = inserter(&sh, &lc, &o, 1, NODE_A, 8, NEW);
            let t2 = inserter(&sh, &lc, &o, 2, NODE_B, 16, NEW2);
            let (sf, lf) = (sh.clone(), lc.clone());
            let f: Role = Box::new(move || lf.flush_all(&mem(&sf, 3)));
            run_roles(rev, vec![t1, t2, f]);
            for w in [1, 2] {
                assert!(o.lock().unwrap()[w].unwrap().1, "inserter {w} failed");
            }
            drain_and_check_capacity(&sh, &lc, 24);
            sh.assert_durable(8, NEW, "end");
            sh.assert_durable(16, NEW2, "end");
        },
    );
}

#[test]
fn lc_two_inserters_and_flusher_fwd() {
    lc_two_inserters_and_flusher(false);
}

#[test]
fn lc_two_inserters_and_flusher_rev() {
    lc_two_inserters_and_flusher(true);
}

/// Two inserters race on the same link (same expected value) while a flusher
/// runs: exactly one installs its value; the loser's CAS failure (CasFailed, or a
/// failed link-and-persist after NoRoom) wrote nothing; the winner's value is
/// durable after a final flush; the bucket drains.
fn lc_same_link_race(rev: bool) {
    check(
        &format!("lc_same_link_race(rev {rev})"),
        Some(3),
        move || {
            let sh = Shared::new(&[OLD, 0], Wb::AtFlush);
            let lc = Arc::new(LinkCache::new(1));
            let o = out(3);
            let t1 = inserter(&sh, &lc, &o, 1, NODE_A, 8, NEW);
            let t2 = inserter(&sh, &lc, &o, 2, NODE_A, 8, NEW2);
            let (sf, lf) = (sh.clone(), lc.clone());
            let f: Role = Box::new(move || lf.flush_all(&mem(&sf, 3)));
            run_roles(rev, vec![t1, t2, f]);
            let (ok1, ok2) = {
                let o = o.lock().unwrap();
                (o[1].unwrap().1, o[2].unwrap().1)
            };
            assert!(ok1 ^ ok2, "winners: {ok1} {ok2}; {:x?}", sh.history(8));
            let win = if ok1 { NEW } else { NEW2 };
            assert_eq!(mem(&sh, MAIN).load(8), win);
            drain_and_check_capacity(&sh, &lc, 16);
            sh.assert_durable(8, win, "end");
        },
    );
}

#[test]
fn lc_same_link_race_fwd() {
    lc_same_link_race(false);
}

#[test]
fn lc_same_link_race_rev() {
    lc_same_link_race(true);
}

// ---------------------------------------------------------------------------
// 3. Reservation against a running flush (entry reuse, ABA).

/// A busy entry (link 8) is being flushed by two flushers (one `flush_buckets`,
/// one `scan` hitting it) while T reserves an entry for link 16. A flusher that
/// collected an entry frees "its" entry at the end: if a reservation could
/// succeed while it is raised, the other flusher could free the entry, T reuse it,
/// and the first flusher free T's entry without writing T's link back. Checked:
/// each flusher finds the old entry's link durable when it returns; T's link is
/// durable after a final flush (its entry was never dropped); the bucket drains.
fn lc_reserve_during_flush(rev: bool) {
    check(
        &format!("lc_reserve_during_flush(rev {rev})"),
        Some(2),
        move || {
            let sh = Shared::new(&[OLD, OLD, 0], Wb::AtFlush);
            let lc = Arc::new(LinkCache::new(1));
            {
                let m = mem(&sh, MAIN);
                assert_eq!(lc.try_link(&m, NODE_A, 8, OLD, NEW).0, Added::Linked);
            }
            let (s1, l1) = (sh.clone(), lc.clone());
            let f1: Role = Box::new(move || {
                l1.flush_buckets(&mem(&s1, 1), 1);
                s1.assert_durable(8, NEW, "flusher after flush_buckets");
            });
            let (s2, l2) = (sh.clone(), lc.clone());
            let f2: Role = Box::new(move || {
                l2.scan(&mem(&s2, 2), NODE_A);
                s2.assert_durable(8, NEW, "scanner after scan");
            });
            let o = out(4);
            let t = inserter(&sh, &lc, &o, 3, NODE_B, 16, NEW2);
            run_roles(rev, vec![f1, f2, t]);
            assert!(o.lock().unwrap()[3].unwrap().1, "T failed");
            drain_and_check_capacity(&sh, &lc, 24);
            sh.assert_durable(16, NEW2, "end");
        },
    );
}

#[test]
fn lc_reserve_during_flush_fwd() {
    lc_reserve_during_flush(false);
}

#[test]
fn lc_reserve_during_flush_rev() {
    lc_reserve_during_flush(true);
}
