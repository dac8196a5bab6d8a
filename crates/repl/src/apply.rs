//! The apply side of a node: committed entries to the server's state
//! machine, exactly once across restarts, on one thread or on several
//! (Blizzard §6: operations on different keys commute).
//!
//! # Lanes
//! With `apply_lanes` 1 every entry is applied in log order by one thread
//! and records its index under [`APPLIED_KEY`] in its own batch.
//!
//! With more lanes, a data entry whose keys have one owner (the state
//! machine's [`StateMachine::footprint`]: for the server, one client key
//! and the pieces under it) belongs to virtual lane `owner % VLANES`, which
//! runs on thread `lane % apply_lanes`; it records its index under its
//! virtual lane's mark ([`lane_key`]) in its own batch. Every other entry
//! (several owners, no owner, an event, an empty or configuration entry)
//! is a **barrier**: applied alone on thread 0 under [`APPLIED_KEY`].
//!
//! A run of committed entries is cut into segments. A segment's entries go
//! to their threads and are applied there in log order, all threads at
//! once; the segment ends (each thread commits its session and answers its
//! proposers) before a barrier, and before an entry that writes a key some
//! other thread wrote in the segment (the footprint lists every store key,
//! so two threads never write one key at once, whatever the owners say).
//! A barrier's own batch is committed before any other thread applies an
//! entry after it.
//!
//! # Exactly once
//! Three invariants hold across crashes:
//! 1. every entry up to [`APPLIED_KEY`] is applied (a barrier writes it
//!    after every earlier entry was committed; the end of a run writes it
//!    after every thread committed);
//! 2. a data entry of virtual lane `v` at or below `v`'s mark is applied
//!    (a lane's entries are applied in log order on one session, whose
//!    batches become durable in order);
//! 3. no other entry is applied (each batch writes its own mark).
//!
//! Raft-rs hands back the entries after [`APPLIED_KEY`] at a restart; the
//! apply thread skips a data entry whose lane's mark covers it. The rules
//! do not depend on the number of threads: a heap written with N lanes
//! restarts correctly with M.

use crate::node::{
    fail_all, parse_ctx, ApplyMsg, Event, ReplError, Shared, StateMachine, Waiter, TAG_DATA,
    TAG_EVENT,
};
use crate::storage::{lane_key, APPLIED_KEY, VLANES};
use raft::eraftpb::{Entry, EntryType};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

/// The most apply threads a node runs.
pub const MAX_LANES: usize = 16;

/// Makes the state machine of apply thread `lane` (called on that thread).
pub type MakeStateMachine<T> = Arc<dyn Fn(usize) -> Box<dyn StateMachine<T>> + Send + Sync>;

/// An entry handed to a lane thread.
struct Item<T> {
    e: Entry,
    waiter: Option<Waiter<T>>,
    mark: Vec<u8>,
}

/// Applies a segment's entries of one thread on its state machine, answers
/// their proposers, and commits. Err: the state machine failed (the node
/// stops).
///
/// The proposers are answered before the commit (`sync`): an entry is
/// already durable in the Raft log of a majority, and what its apply wrote
/// (with its index under the lane's mark, one batch) is made durable in
/// chain order; a crash before the commit loses applies, never entries, and
/// a restart applies again what the mark does not cover. The commit still
/// comes before the raft thread hears of the applied index (`Event::Applied`,
/// which compaction follows), so no entry is dropped from the log before its
/// apply is durable. Under `msync` this takes one device flush of three off
/// every replicated write's path (leader's log, followers' logs, apply).
fn run_items<T>(sm: &mut dyn StateMachine<T>, items: Vec<Item<T>>) -> Result<(), String> {
    let mut done = Vec::with_capacity(items.len());
    let mut items = items.into_iter();
    while let Some(it) = items.next() {
        let r = sm.apply(it.e.index, &it.e.data[1..], it.waiter.is_some(), &it.mark);
        if let Some(why) = sm.failed() {
            fail_done(done, &why);
            for it in std::iter::once(it).chain(items) {
                if let Some(w) = it.waiter {
                    let _ = w.send(Err(ReplError::Stopped(why.clone())));
                }
            }
            return Err(why);
        }
        if let Some(w) = it.waiter {
            done.push((w, r));
        }
    }
    for (w, r) in done {
        let _ = w.send(Ok(r));
    }
    sm.sync();
    match sm.failed() {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

fn fail_done<T>(done: Vec<(Waiter<T>, T)>, why: &str) {
    for (w, _) in done {
        let _ = w.send(Err(ReplError::Stopped(why.to_string())));
    }
}

/// The state machine failed (or could not start): the node stops rather
/// than diverge, and every waiter is told why.
pub(crate) fn stop<T>(sh: &Shared<T>, why: String, inbox: &Sender<Event>) {
    sh.status.lock().unwrap_or_else(|p| p.into_inner()).failed = Some(why.clone());
    sh.leader.store(false, Ordering::Relaxed);
    fail_all(sh, &ReplError::Stopped(why));
    let _ = inbox.send(Event::Stop);
}

/// A lane thread (1..): applies what the apply thread hands it.
fn lane_loop<T>(
    mut sm: Box<dyn StateMachine<T>>,
    rx: Receiver<Vec<Item<T>>>,
    done: Sender<Result<(), String>>,
) {
    while let Ok(items) = rx.recv() {
        let r = run_items(&mut *sm, items);
        let failed = r.is_err();
        if done.send(r).is_err() || failed {
            return;
        }
    }
}

/// The apply thread (thread 0 of the lanes).
pub(crate) struct Applier<T> {
    sh: Arc<Shared<T>>,
    sm: Box<dyn StateMachine<T>>,
    lanes: Vec<Sender<Vec<Item<T>>>>,
    lanes_done: Receiver<Result<(), String>>,
    /// The lane marks found at start (cleared once the applied index has
    /// passed them all).
    marks: Vec<u64>,
    max_mark: u64,
    /// This run's segment: entries per thread, and the thread that wrote
    /// each key (by hash).
    seg: Vec<Vec<Item<T>>>,
    seg_keys: HashMap<u64, usize>,
    seg_len: usize,
    /// Thread 0 applied barriers not yet committed, and their proposers.
    dirty: bool,
    done0: Vec<(Waiter<T>, T)>,
    keys: Vec<u64>,
}

impl<T: Send + 'static> Applier<T> {
    pub(crate) fn start(
        sh: Arc<Shared<T>>,
        make: MakeStateMachine<T>,
        nlanes: usize,
    ) -> Result<Applier<T>, String> {
        let mut sm = make(0);
        let marks = sm.lane_marks()?;
        let max_mark = marks.iter().copied().max().unwrap_or(0);
        let (done_tx, lanes_done) = std::sync::mpsc::channel();
        let mut lanes = Vec::new();
        for lane in 1..nlanes.clamp(1, MAX_LANES) {
            let (tx, rx) = std::sync::mpsc::channel();
            let make = make.clone();
            let done = done_tx.clone();
            std::thread::Builder::new()
                .name(format!("raft-apply-{lane}"))
                .spawn(move || lane_loop(make(lane), rx, done))
                .map_err(|e| e.to_string())?;
            lanes.push(tx);
        }
        let n = lanes.len() + 1;
        Ok(Applier {
            sh,
            sm,
            lanes,
            lanes_done,
            marks,
            max_mark,
            seg: (0..n).map(|_| Vec::new()).collect(),
            seg_keys: HashMap::new(),
            seg_len: 0,
            dirty: false,
            done0: Vec::new(),
            keys: Vec::new(),
        })
    }

    /// Runs until the raft thread goes.
    pub(crate) fn run(mut self, rx: &Receiver<ApplyMsg>, inbox: &Sender<Event>) {
        while let Ok(msg) = rx.recv() {
            let ents = match msg {
                ApplyMsg::Entries(ents) => ents,
                ApplyMsg::Dump(path) => {
                    // Between runs of entries: the state at one index,
                    // streamed to the file as it is read.
                    let index = self.sh.applied.load(Ordering::Acquire);
                    let sm = &mut self.sm;
                    let data = crate::storage::write_dump(&path, |out| sm.dump(out));
                    if inbox.send(Event::Dumped { index, data }).is_err() {
                        return;
                    }
                    continue;
                }
            };
            let sh = self.sh.clone();
            let _run = sh.apply_lock.lock().unwrap_or_else(|p| p.into_inner());
            let last = ents.last().map_or(0, |e| e.index);
            if let Err(why) = self.apply_run(ents) {
                fail_done(std::mem::take(&mut self.done0), &why);
                for items in &mut self.seg {
                    for it in items.drain(..) {
                        if let Some(w) = it.waiter {
                            let _ = w.send(Err(ReplError::Stopped(why.clone())));
                        }
                    }
                }
                stop(&sh, why, inbox);
                return;
            }
            if last == 0 {
                continue;
            }
            sh.applied.store(last, Ordering::Release);
            if inbox.send(Event::Applied(last)).is_err() {
                return;
            }
        }
    }

    /// The virtual lane of a data entry (None: a barrier), with its keys'
    /// hashes in `self.keys`.
    fn lane_of(&mut self, e: &Entry) -> Option<u64> {
        if e.get_entry_type() != EntryType::EntryNormal || e.data.first() != Some(&TAG_DATA) {
            return None;
        }
        self.keys.clear();
        self.sm
            .footprint(&e.data[1..], &mut self.keys)
            .map(|o| o % VLANES)
    }

    fn apply_run(&mut self, ents: Vec<Entry>) -> Result<(), String> {
        let parallel = !self.lanes.is_empty();
        let mut segmented = false;
        let mut last = 0;
        for e in ents {
            last = e.index;
            // A restart hands back entries after the applied index; those a
            // lane already applied are skipped.
            if e.index <= self.max_mark {
                if let Some(v) = self.lane_of(&e) {
                    if self.marks[v as usize] >= e.index {
                        // The run's end records it applied under `raft/a`
                        // (raft-rs now counts it applied, and may compact
                        // the log past it).
                        segmented = true;
                        continue;
                    }
                }
            }
            let waiter = parse_ctx(&e.context)
                .filter(|&(id, _)| id == self.sh.id)
                .and_then(|(_, seq)| {
                    self.sh
                        .waiters
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&seq)
                });
            let lane = if parallel { self.lane_of(&e) } else { None };
            let Some(v) = lane else {
                // A barrier: after everything before it, alone.
                self.flush()?;
                self.barrier(e, waiter)?;
                continue;
            };
            segmented = true;
            let t = v as usize % (self.lanes.len() + 1);
            if self
                .keys
                .iter()
                .any(|k| self.seg_keys.get(k).is_some_and(|&o| o != t))
            {
                self.flush()?;
            }
            if self.dirty && t != 0 {
                self.commit0()?;
            }
            for &k in &self.keys {
                self.seg_keys.insert(k, t);
            }
            self.seg_len += 1;
            self.seg[t].push(Item {
                e,
                waiter,
                mark: lane_key(v),
            });
        }
        self.flush()?;
        if self.dirty {
            self.commit0()?;
        }
        if segmented {
            // Every thread committed everything up to `last`.
            self.sm.skip(last);
            if let Some(why) = self.sm.failed() {
                return Err(why);
            }
        }
        if last >= self.max_mark {
            self.max_mark = 0;
        }
        Ok(())
    }

    /// Applies a barrier entry on thread 0 (not committed yet).
    fn barrier(&mut self, e: Entry, waiter: Option<Waiter<T>>) -> Result<(), String> {
        let own = waiter.is_some();
        let normal = e.get_entry_type() == EntryType::EntryNormal;
        let r = match e.data.first() {
            Some(&TAG_DATA) if normal => {
                Some(self.sm.apply(e.index, &e.data[1..], own, APPLIED_KEY))
            }
            Some(&TAG_EVENT) if normal => Some(self.sm.event(e.index, &e.data[1..], own)),
            _ => {
                self.sm.skip(e.index);
                None
            }
        };
        self.dirty = true;
        if let (Some(w), Some(r)) = (waiter, r) {
            self.done0.push((w, r));
        }
        match self.sm.failed() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Answers thread 0's proposers and commits its session (answered
    /// first: see `run_items`).
    fn commit0(&mut self) -> Result<(), String> {
        for (w, r) in self.done0.drain(..) {
            let _ = w.send(Ok(r));
        }
        self.sm.sync();
        if let Some(why) = self.sm.failed() {
            return Err(why);
        }
        self.dirty = false;
        Ok(())
    }

    /// Applies the segment: each thread its entries, all at once; returns
    /// once every thread has committed them.
    fn flush(&mut self) -> Result<(), String> {
        self.seg_keys.clear();
        let mut sent = 0usize;
        for (t, tx) in self.lanes.iter().enumerate() {
            let items = std::mem::take(&mut self.seg[t + 1]);
            if items.is_empty() {
                continue;
            }
            if tx.send(items).is_err() {
                return Err(format!("apply thread {} ended", t + 1));
            }
            sent += 1;
        }
        let mine = std::mem::take(&mut self.seg[0]);
        if sent + usize::from(!mine.is_empty()) > 1 {
            self.sh
                .applied_in_parallel
                .fetch_add(self.seg_len as u64, Ordering::Relaxed);
        }
        self.seg_len = 0;
        let mut r = Ok(());
        if !mine.is_empty() {
            // Barriers before them on this thread are in the same session:
            // committed together.
            r = run_items(&mut *self.sm, mine);
            if r.is_ok() {
                self.dirty = false;
                for (w, out) in self.done0.drain(..) {
                    let _ = w.send(Ok(out));
                }
            }
        }
        for _ in 0..sent {
            let got = self
                .lanes_done
                .recv()
                .unwrap_or_else(|_| Err("an apply thread ended".into()));
            if r.is_ok() {
                r = got;
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::read_applied;
    use engine::volatile::VolatileStore;
    use engine::{Session, Store, WriteBatch};
    use std::sync::Mutex;

    /// Entry data: `k<name>[,<name>...]` increments the counters named (the
    /// first is the owner); `*`
    /// increments every counter named after it, comma-separated (a
    /// barrier). Increments are not idempotent: applying an entry twice
    /// shows.
    struct Counters {
        sess: Box<dyn Session>,
        log: Log,
    }

    /// (key, index) in the order applied, over every thread.
    type Log = Arc<Mutex<Vec<(Vec<u8>, u64)>>>;

    fn names(data: &[u8]) -> Vec<Vec<u8>> {
        data[1..]
            .split(|&b| b == b',')
            .map(|n| n.to_vec())
            .collect()
    }

    fn hash(k: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        foldhash::fast::FixedState::with_seed(7).hash_one(k)
    }

    impl StateMachine<u64> for Counters {
        fn apply(&mut self, index: u64, data: &[u8], _own: bool, mark: &[u8]) -> u64 {
            let mut b = WriteBatch::new();
            let mut v = Vec::new();
            for n in names(data) {
                let old = if self.sess.get(&n, &mut v).unwrap() {
                    u64::from_le_bytes(v.as_slice().try_into().unwrap())
                } else {
                    0
                };
                b.put(&n, &(old + 1).to_le_bytes());
                self.log.lock().unwrap().push((n, index));
            }
            b.put(mark, &index.to_le_bytes());
            self.sess.apply_batch(&b, &mut Vec::new()).unwrap();
            index
        }
        fn skip(&mut self, index: u64) {
            let mut b = WriteBatch::new();
            b.put(APPLIED_KEY, &index.to_le_bytes());
            self.sess.apply_batch(&b, &mut Vec::new()).unwrap();
        }
        fn event(&mut self, index: u64, _data: &[u8], _own: bool) -> u64 {
            self.skip(index);
            index
        }
        fn dump(&mut self, _out: &mut dyn std::io::Write) -> Result<(), String> {
            Err("no dumps here".into())
        }
        fn footprint(&self, data: &[u8], keys: &mut Vec<u64>) -> Option<u64> {
            let ns = names(data);
            keys.extend(ns.iter().map(|n| hash(n)));
            (data[0] == b'k').then(|| hash(&ns[0]))
        }
        fn lane_marks(&mut self) -> Result<Vec<u64>, String> {
            crate::storage::read_lane_marks(&mut *self.sess).map_err(|e| e.to_string())
        }
    }

    fn entry(index: u64, data: &[u8]) -> Entry {
        let mut d = vec![TAG_DATA];
        d.extend_from_slice(data);
        Entry {
            index,
            term: 1,
            data: d.into(),
            ..Default::default()
        }
    }

    /// Runs `runs` of entries through an applier with `lanes` threads.
    fn apply_runs(store: &VolatileStore, lanes: usize, runs: Vec<Vec<Entry>>, log: &Log) {
        let sh = Shared::<u64>::for_test(1);
        let st = store.clone();
        let lg = log.clone();
        let make: MakeStateMachine<u64> = Arc::new(move |_| {
            Box::new(Counters {
                sess: Box::new(st.session().unwrap()),
                log: lg.clone(),
            }) as Box<dyn StateMachine<u64>>
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let (inbox, events) = std::sync::mpsc::channel();
        let t =
            std::thread::spawn(move || Applier::start(sh, make, lanes).unwrap().run(&rx, &inbox));
        for run in runs {
            let last = run.last().unwrap().index;
            tx.send(ApplyMsg::Entries(run)).unwrap();
            match events.recv().unwrap() {
                Event::Applied(i) => assert_eq!(i, last),
                _ => panic!("the applier stopped"),
            }
        }
        drop(tx);
        t.join().unwrap();
    }

    fn counter(store: &VolatileStore, n: &[u8]) -> u64 {
        let mut v = Vec::new();
        let mut s = store.session().unwrap();
        if s.get(n, &mut v).unwrap() {
            u64::from_le_bytes(v.as_slice().try_into().unwrap())
        } else {
            0
        }
    }

    /// Entries 1..=n over `keys` counters, a barrier every so often, cut
    /// into runs of 1 to 40 entries; the expected counts.
    fn workload(
        seed: u64,
        from: u64,
        n: u64,
        barriers: bool,
    ) -> (Vec<Vec<Entry>>, HashMap<Vec<u8>, u64>) {
        let mut x = seed | 1;
        let mut next = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut want: HashMap<Vec<u8>, u64> = HashMap::new();
        let mut runs = Vec::new();
        let mut run = Vec::new();
        for i in from..from + n {
            let data = if barriers && next(10) == 0 {
                let a = next(12);
                let b = (a + 1 + next(11)) % 12;
                format!("*c{a},c{b}")
            } else if next(8) == 0 {
                // An owner's entry that also writes a key another owner's
                // entries write: those must not run at once.
                format!("kc{},p{}", next(12), next(3))
            } else {
                format!("kc{}", next(12))
            };
            for n in names(data.as_bytes()) {
                *want.entry(n).or_default() += 1;
            }
            run.push(entry(i, data.as_bytes()));
            if next(20) == 0 || run.len() >= 40 {
                runs.push(std::mem::take(&mut run));
            }
        }
        if !run.is_empty() {
            runs.push(run);
        }
        (runs, want)
    }

    #[test]
    fn parallel_apply_keeps_each_keys_order_and_applies_once() {
        for lanes in [1, 2, 3, 5] {
            for seed in 1..6u64 {
                let store = VolatileStore::new(64);
                let log = Arc::new(Mutex::new(Vec::new()));
                let (runs, want) = workload(seed, 1, 1500, true);
                apply_runs(&store, lanes, runs, &log);
                for (n, c) in &want {
                    assert_eq!(counter(&store, n), *c, "lanes {lanes} seed {seed}");
                }
                // Every counter's entries in log order.
                let mut last: HashMap<Vec<u8>, u64> = HashMap::new();
                for (n, i) in log.lock().unwrap().iter() {
                    let l = last.entry(n.clone()).or_default();
                    assert!(*l < *i, "lanes {lanes}: {n:?} applied {i} after {l}");
                    *l = *i;
                }
                let mut s = store.session().unwrap();
                assert_eq!(read_applied(&mut s).unwrap(), 1500);
            }
        }
    }

    /// Raft hands back the entries after the applied index at a restart:
    /// those a lane applied (its mark covers them) are not applied again,
    /// whatever the number of threads now.
    #[test]
    fn entries_a_lane_applied_are_skipped_after_a_restart() {
        for (before, after) in [(3, 3), (3, 1), (2, 4)] {
            let store = VolatileStore::new(64);
            let log = Arc::new(Mutex::new(Vec::new()));
            let (runs, mut want) = workload(9, 1, 600, false);
            apply_runs(&store, before, runs.clone(), &log);
            // The end of the run's applied index is its own batch: a crash
            // may lose it and keep every lane's entries.
            let mut s = store.session().unwrap();
            let mut b = WriteBatch::new();
            b.remove(APPLIED_KEY);
            s.apply_batch(&b, &mut Vec::new()).unwrap();
            drop(s);
            // The restart: every entry again (all skipped, and recorded
            // applied), then more.
            apply_runs(&store, after, runs, &log);
            let mut s = store.session().unwrap();
            assert_eq!(read_applied(&mut s).unwrap(), 600);
            drop(s);
            let (more, want2) = workload(10, 601, 400, true);
            apply_runs(&store, after, more, &log);
            for (n, c) in want2 {
                *want.entry(n).or_default() += c;
            }
            for (n, c) in &want {
                assert_eq!(counter(&store, n), *c, "{before} then {after} lanes: {n:?}");
            }
        }
    }
}
