//! Pipelined group commit (msync mode, `commit-pipeline yes`): a worker hands
//! each large batch's commit to its syncer thread and goes on with the next
//! batch while the device writes; the batch's replies are held until the
//! commit completes.
//!
//! With the msync strategy a commit is an `msync` of the pages the batch
//! appended to: a wait for the device (a fraction of a millisecond or more)
//! during which a worker committing in line would sit idle, and so would its
//! clients, which are waiting for their replies. Here the worker detaches the
//! batch's fence (`Session::commit_detached`), sends it to the syncer and
//! serves the next batches meanwhile; their writes wait in the session for the
//! next commit, submitted when this one completes (one device write at a time,
//! each covering everything served during the one before). A batch's replies,
//! reads included, are written only once the commit covering the batch (and so
//! every commit before it) is complete: a reply never acknowledges a write, nor
//! shows a value this worker wrote, that is not durable yet, as with the commit
//! in line. Commits complete in the order they were submitted (one syncer
//! thread per worker, a FIFO queue), which the store requires: a later batch's
//! records may follow an earlier one's in the same log.
//!
//! Positions in a client's output are absolute (bytes ever queued), so that
//! they survive the buffer being compacted as it is written.

use engine::PendingCommit;
use mio::{Token, Waker};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A commit's outcome: its ticket, and the error when it failed (its batch's
/// writes are then not durable and must not be acknowledged).
type Done = (u64, Result<(), String>);

/// One worker's commits in flight and the replies they hold.
pub struct Committer {
    name: String,
    waker: Arc<Waker>,
    tx: Option<Sender<(u64, PendingCommit)>>,
    done: Option<Receiver<Done>>,
    thread: Option<JoinHandle<()>>,
    /// The CPU the worker last submitted from (-1: unknown), which the syncer
    /// follows (see `syncer`).
    cpu: Arc<AtomicI32>,
    /// Outcomes of commits completed in line (no syncer thread).
    inline: VecDeque<Done>,
    /// Tickets of the last commit submitted and of the last completed.
    submitted: u64,
    completed: u64,
    /// Batches whose replies wait: the ticket they wait for (`submitted + 1`
    /// when it is the next commit, not submitted yet), and each client's
    /// output position at the end of the batch.
    held: VecDeque<(u64, Vec<(Token, u64)>)>,
}

/// What `reap` found: output that may now be written (client, up to an
/// absolute position), and clients whose batch failed to commit.
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Reaped {
    pub release: Vec<(Token, u64)>,
    pub failed: Vec<Token>,
    pub errors: Vec<String>,
}

impl Committer {
    /// `waker` wakes the worker's poll when a commit completes; the syncer
    /// thread (named `name`) starts with the first commit.
    pub fn new(name: String, waker: Arc<Waker>) -> Committer {
        Committer {
            name,
            waker,
            tx: None,
            done: None,
            thread: None,
            cpu: Arc::new(AtomicI32::new(-1)),
            inline: VecDeque::new(),
            submitted: 0,
            completed: 0,
            held: VecDeque::new(),
        }
    }

    /// Whether a commit has not completed yet (or its outcome is not reaped):
    /// a batch served now joins the next commit, submitted after it.
    pub fn in_flight(&self) -> bool {
        self.completed < self.submitted
    }

    /// Whether replies are held.
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether held replies wait for a commit not submitted yet.
    pub fn waiting_for_next(&self) -> bool {
        self.held.back().is_some_and(|(t, _)| *t > self.submitted)
    }

    /// Queues a commit for the syncer (completed in order). When the syncer
    /// cannot run, completes it here, in line; its outcome is reaped as any.
    pub fn submit(&mut self, p: PendingCommit) {
        self.submitted += 1;
        let ticket = self.submitted;
        // SAFETY: sched_getcpu takes no arguments and touches no memory of
        // ours; it returns the CPU this thread runs on, or -1 (then the
        // syncer stays where it is).
        self.cpu
            .store(unsafe { libc::sched_getcpu() }, Ordering::Relaxed);
        if self.tx.is_none() {
            let (tx, rx) = channel::<(u64, PendingCommit)>();
            let (dtx, drx) = channel::<Done>();
            let waker = self.waker.clone();
            let cpu = self.cpu.clone();
            match std::thread::Builder::new()
                .name(self.name.clone())
                .spawn(move || syncer(rx, dtx, waker, cpu))
            {
                Ok(h) => {
                    self.tx = Some(tx);
                    self.done = Some(drx);
                    self.thread = Some(h);
                }
                Err(e) => {
                    eprintln!("ember: cannot start the syncer thread ({e}): committing in line");
                    let r = p.complete().map_err(|e| e.to_string());
                    self.inline.push_back((ticket, r));
                    // Reaped in the worker's next round, not after a poll timeout.
                    let _ = self.waker.wake();
                    return;
                }
            }
        }
        let tx = self.tx.as_ref().expect("started above");
        if let Err(std::sync::mpsc::SendError((_, p))) = tx.send((ticket, p)) {
            // The syncer is gone (it exits only when `finish` drops the queue).
            let r = p.complete().map_err(|e| e.to_string());
            self.inline.push_back((ticket, r));
            let _ = self.waker.wake();
        }
    }

    /// Holds a batch's replies until the commit covering its writes, if any,
    /// has completed: the last one submitted when the batch committed in it,
    /// else (`next`) the one that will be submitted next. `marks` are the
    /// batch's clients' output positions at its end. Returns them when nothing
    /// is in flight nor waiting: they may be written now.
    pub fn hold(&mut self, marks: Vec<(Token, u64)>, next: bool) -> Vec<(Token, u64)> {
        let ticket = if next {
            self.submitted + 1
        } else {
            self.submitted
        };
        if ticket <= self.completed {
            return marks;
        }
        self.held.push_back((ticket, marks));
        Vec::new()
    }

    /// The replies waiting for a next commit when there is nothing left to
    /// commit (their batches wrote nothing that is not durable already): they
    /// waited only for the commits before, which have completed.
    pub fn release_next(&mut self) -> Vec<(Token, u64)> {
        debug_assert!(!self.in_flight());
        let mut out = Vec::new();
        while self.held.back().is_some_and(|(t, _)| *t > self.submitted) {
            let (_, marks) = self.held.pop_back().expect("checked");
            out.splice(0..0, marks);
        }
        out
    }

    /// The clients of the batches waiting for a next commit that could not be
    /// made (the error is the caller's to report).
    pub fn fail_next(&mut self) -> Vec<Token> {
        self.release_next().into_iter().map(|(t, _)| t).collect()
    }

    /// Takes the outcomes of completed commits (blocking until all submitted
    /// are in when `wait_all`): the replies they held are released, or their
    /// clients reported failed.
    pub fn reap(&mut self, wait_all: bool) -> Reaped {
        let mut out = Reaped::default();
        loop {
            let next = if let Some(d) = self.inline.pop_front() {
                Some(d)
            } else if let Some(rx) = &self.done {
                if wait_all && self.completed < self.submitted {
                    rx.recv().ok()
                } else {
                    rx.try_recv().ok()
                }
            } else {
                None
            };
            let Some((ticket, r)) = next else { break };
            self.completed = ticket;
            if let Err(e) = r {
                out.errors.push(e);
                // This batch and those behind it (a later commit's records
                // may sit behind this one's in the same log).
                while let Some((_, marks)) = self.held.pop_front() {
                    out.failed.extend(marks.into_iter().map(|(t, _)| t));
                }
            }
        }
        while self.held.front().is_some_and(|(t, _)| *t <= self.completed) {
            let (_, marks) = self.held.pop_front().expect("checked");
            out.release.extend(marks);
        }
        out
    }

    /// Completes everything submitted and stops the syncer (replies waiting
    /// for a next commit stay held: the caller commits or releases them).
    pub fn finish(&mut self) -> Reaped {
        let r = self.reap(true);
        self.tx = None;
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
        r
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// The syncer: completes commits in order, waking the worker after each (the
/// next one queued is another device write: the replies already durable go
/// out meanwhile).
///
/// It runs on the CPU its worker last submitted from. An `msync` write-protects
/// the pages it writes out, and when another thread of the process runs on
/// another CPU (the worker, appending to those pages) every such change costs
/// an inter-processor interrupt to flush that CPU's TLB (on a virtual
/// machine, a VM exit each). On the worker's CPU the flush is local, and the
/// syncer still overlaps the device's wait with the worker's work (it sleeps
/// while the device writes).
fn syncer(
    rx: Receiver<(u64, PendingCommit)>,
    done: Sender<Done>,
    waker: Arc<Waker>,
    cpu: Arc<AtomicI32>,
) {
    let mut on = -1;
    while let Ok((ticket, p)) = rx.recv() {
        let want = cpu.load(Ordering::Relaxed);
        if want >= 0 && want != on {
            follow(want);
            on = want;
        }
        let r = p.complete().map_err(|e| e.to_string());
        if done.send((ticket, r)).is_err() {
            return;
        }
        let _ = waker.wake();
    }
}

/// Moves the calling thread to `cpu` (best effort: a CPU outside the
/// process's allowed set is refused, and the thread stays where it was).
fn follow(cpu: i32) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays within it
    // for any cpu below CPU_SETSIZE (checked); sched_setaffinity(0, ..) applies
    // to the calling thread and only reads the set.
    unsafe {
        if cpu as usize >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::Poll;
    use std::sync::mpsc::sync_channel;
    use std::time::Duration;

    fn committer() -> (Committer, Poll) {
        let poll = Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), Token(0)).unwrap());
        (Committer::new("test-syncer".into(), waker), poll)
    }

    /// A commit that completes when the returned sender sends its outcome.
    fn gated() -> (PendingCommit, std::sync::mpsc::SyncSender<bool>) {
        let (tx, rx) = sync_channel::<bool>(1);
        let p = PendingCommit::new(move || {
            if rx.recv().unwrap_or(true) {
                Ok(())
            } else {
                Err(engine::Error::Corrupt("injected sync failure".into()))
            }
        });
        (p, tx)
    }

    #[test]
    fn nothing_in_flight_releases_at_once() {
        let (mut c, _poll) = committer();
        let marks = vec![(Token(1), 10), (Token(2), 20)];
        assert_eq!(c.hold(marks.clone(), false), marks);
        assert!(!c.holding() && !c.waiting_for_next());
    }

    /// Waits (bounded) for the commits in flight to be reaped.
    fn reap_some(c: &mut Committer) -> Reaped {
        for _ in 0..5000 {
            let r = c.reap(false);
            if r != Reaped::default() {
                return r;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("no commit completed");
    }

    #[test]
    fn replies_wait_for_the_commit_that_covers_their_batch() {
        let (mut c, mut poll) = committer();
        let (p1, go1) = gated();
        c.submit(p1);
        assert!(c.hold(vec![(Token(1), 5)], false).is_empty());
        // Batches served while commit 1 is in flight join commit 2, reads too.
        assert!(c.in_flight());
        assert!(c.hold(vec![(Token(2), 7)], true).is_empty());
        assert!(c.hold(vec![(Token(1), 9)], true).is_empty());
        assert!(c.waiting_for_next());
        assert_eq!(c.reap(false), Reaped::default(), "released before the sync");
        go1.send(true).unwrap();
        // The syncer wakes the worker's poll once the commit is done.
        let mut ev = mio::Events::with_capacity(4);
        poll.poll(&mut ev, Some(Duration::from_secs(10))).unwrap();
        assert!(ev.iter().any(|e| e.token() == Token(0)), "no wake-up");
        let r = reap_some(&mut c);
        assert_eq!(r.release, vec![(Token(1), 5)]);
        assert!(!c.in_flight() && c.waiting_for_next());
        // The worker submits what accumulated as the next commit.
        let (p2, go2) = gated();
        c.submit(p2);
        assert!(!c.waiting_for_next() && c.in_flight());
        go2.send(true).unwrap();
        let r = c.finish();
        assert_eq!(r.release, vec![(Token(2), 7), (Token(1), 9)]);
        assert!(r.failed.is_empty() && !c.holding() && !c.in_flight());
    }

    #[test]
    fn with_nothing_left_to_commit_the_waiting_replies_go() {
        let (mut c, _poll) = committer();
        let (p1, go1) = gated();
        c.submit(p1);
        assert!(c.hold(vec![(Token(3), 4)], true).is_empty());
        go1.send(true).unwrap();
        let r = c.finish();
        assert!(r.release.is_empty());
        assert_eq!(c.release_next(), vec![(Token(3), 4)]);
        assert!(!c.holding());
    }

    #[test]
    fn a_failed_commit_fails_its_batch_and_those_behind_it() {
        let (mut c, _poll) = committer();
        let (p1, go1) = gated();
        c.submit(p1);
        assert!(c.hold(vec![(Token(1), 5)], false).is_empty());
        assert!(c.hold(vec![(Token(2), 6)], true).is_empty());
        go1.send(false).unwrap();
        let r = c.finish();
        assert!(r.release.is_empty(), "released a failed batch: {r:?}");
        assert_eq!(r.failed, vec![Token(1), Token(2)]);
        assert_eq!(r.errors.len(), 1);
        assert!(r.errors[0].contains("injected"));
    }
}
