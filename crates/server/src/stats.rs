//! Counters for INFO, CONFIG RESETSTAT and the metrics endpoint. Each worker
//! writes only its own [`WorkerStats`] (no cache line shared between workers on
//! the request path); readers add them up.
//!
//! A worker's counters have one writer, so they are [`Counter`]s: a plain
//! load and store, not a locked add. A locked instruction is a full barrier
//! on x86, and a command updates several counters: under a pipelined load
//! each would stall behind the pipeline's outstanding loads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Upper bounds (µs) of the latency histogram buckets (the last is +Inf).
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 1_000_000,
];

/// A counter that one thread writes and any thread reads or resets.
///
/// A reset does not write the writer's word: it records the total it saw as
/// the new zero (`base`), so a reset and an increment racing each other lose
/// neither (the increment lands before or after the reset).
#[derive(Default)]
pub struct Counter {
    total: AtomicU64,
    base: AtomicU64,
}

impl Counter {
    /// Adds `n` (the counter's one writer only).
    #[inline]
    pub fn add(&self, n: u64) {
        let t = self.total.load(Ordering::Relaxed);
        self.total.store(t.wrapping_add(n), Ordering::Relaxed);
    }

    /// Sets the total since the start (the counter's one writer only; a
    /// reset still counts from the total it saw).
    pub fn set_total(&self, n: u64) {
        self.total.store(n, Ordering::Relaxed);
    }

    /// The count since the last reset.
    pub fn get(&self) -> u64 {
        // The base first: the total read after it is at least the one the
        // reset saw (Release/Acquire). The saturation is only a safeguard.
        let b = self.base.load(Ordering::Acquire);
        let t = self.total.load(Ordering::Acquire);
        t.saturating_sub(b)
    }

    /// The count since the start, resets or not (Prometheus counters only grow).
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Acquire)
    }

    /// Counts from zero again.
    pub fn reset(&self) {
        // `fetch_max`: of two resets at once, the later total wins.
        self.base
            .fetch_max(self.total.load(Ordering::Acquire), Ordering::AcqRel);
    }
}

/// Per-command counters.
#[derive(Default)]
pub struct CmdStat {
    pub calls: Counter,
    pub usec: Counter,
    pub failed: Counter,
    pub rejected: Counter,
}

/// One worker's counters.
pub struct WorkerStats {
    pub cmds: Vec<CmdStat>,
    pub hits: Counter,
    pub misses: Counter,
    pub net_in: Counter,
    pub net_out: Counter,
    pub expired_keys: Counter,
    /// Group commits handed to the worker's syncer thread (msync mode).
    pub commits_pipelined: Counter,
    /// Batches whose writes awaited a group commit (msync mode), and their
    /// requests: in line each batch is one commit, whose cost that many
    /// requests share (with `commit-pipeline`, batches held behind a commit
    /// in flight share the next one).
    pub group_commit_batches: Counter,
    pub group_commit_requests: Counter,
    /// Count per latency bucket (`LATENCY_BOUNDS_US.len() + 1`); never reset
    /// (Prometheus counters).
    pub latency: Vec<Counter>,
    pub latency_sum_us: Counter,
}

impl WorkerStats {
    fn new() -> WorkerStats {
        WorkerStats {
            cmds: (0..crate::cmd::TABLE.len())
                .map(|_| CmdStat::default())
                .collect(),
            hits: Counter::default(),
            misses: Counter::default(),
            net_in: Counter::default(),
            net_out: Counter::default(),
            expired_keys: Counter::default(),
            commits_pipelined: Counter::default(),
            group_commit_batches: Counter::default(),
            group_commit_requests: Counter::default(),
            latency: (0..=LATENCY_BOUNDS_US.len())
                .map(|_| Counter::default())
                .collect(),
            latency_sum_us: Counter::default(),
        }
    }

    #[inline]
    pub fn record(&self, cmd: usize, us: u64, failed: bool) {
        let c = &self.cmds[cmd];
        c.calls.add(1);
        c.usec.add(us);
        if failed {
            c.failed.add(1);
        }
        let b = LATENCY_BOUNDS_US
            .iter()
            .position(|&u| us <= u)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        self.latency[b].add(1);
        self.latency_sum_us.add(us);
    }

    fn reset(&self) {
        for c in &self.cmds {
            c.calls.reset();
            c.usec.reset();
            c.failed.reset();
            c.rejected.reset();
        }
        for a in [
            &self.hits,
            &self.misses,
            &self.net_in,
            &self.net_out,
            &self.expired_keys,
        ] {
            a.reset();
        }
    }
}

/// Server-wide counters.
pub struct Stats {
    pub workers: Vec<Arc<WorkerStats>>,
    pub total_connections: AtomicU64,
    pub rejected: AtomicU64,
    /// Clients closed by `client-output-buffer-limit`.
    pub obuf_limit_disconnections: AtomicU64,
}

/// A sum over workers.
#[derive(Default, Clone, Debug)]
pub struct Totals {
    pub commands: u64,
    pub hits: u64,
    pub misses: u64,
    pub net_in: u64,
    pub net_out: u64,
    pub expired_keys: u64,
    pub commits_pipelined: u64,
    pub group_commit_batches: u64,
    pub group_commit_requests: u64,
    pub errors: u64,
    /// Per command: calls, usec, failed, rejected.
    pub per_cmd: Vec<(u64, u64, u64, u64)>,
    pub latency: Vec<u64>,
    pub latency_sum_us: u64,
}

impl Stats {
    pub fn new(workers: usize) -> Stats {
        Stats {
            workers: (0..workers).map(|_| Arc::new(WorkerStats::new())).collect(),
            total_connections: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            obuf_limit_disconnections: AtomicU64::new(0),
        }
    }

    /// The counts since the last CONFIG RESETSTAT (INFO).
    pub fn totals(&self) -> Totals {
        self.sum(Counter::get)
    }

    /// The counts since the start, which CONFIG RESETSTAT does not touch (the
    /// metrics endpoint: a Prometheus counter only grows).
    pub fn totals_since_start(&self) -> Totals {
        self.sum(Counter::total)
    }

    fn sum(&self, ld: impl Fn(&Counter) -> u64) -> Totals {
        let n = crate::cmd::TABLE.len();
        let mut t = Totals {
            per_cmd: vec![(0, 0, 0, 0); n],
            latency: vec![0; LATENCY_BOUNDS_US.len() + 1],
            ..Default::default()
        };
        for w in &self.workers {
            t.hits += ld(&w.hits);
            t.misses += ld(&w.misses);
            t.net_in += ld(&w.net_in);
            t.net_out += ld(&w.net_out);
            t.expired_keys += ld(&w.expired_keys);
            t.commits_pipelined += ld(&w.commits_pipelined);
            t.group_commit_batches += ld(&w.group_commit_batches);
            t.group_commit_requests += ld(&w.group_commit_requests);
            t.latency_sum_us += ld(&w.latency_sum_us);
            for (i, c) in w.cmds.iter().enumerate() {
                let e = &mut t.per_cmd[i];
                e.0 += ld(&c.calls);
                e.1 += ld(&c.usec);
                e.2 += ld(&c.failed);
                e.3 += ld(&c.rejected);
            }
            for (i, b) in w.latency.iter().enumerate() {
                t.latency[i] += ld(b);
            }
        }
        t.commands = t.per_cmd.iter().map(|c| c.0).sum();
        t.errors = t.per_cmd.iter().map(|c| c.2 + c.3).sum();
        t
    }

    /// CONFIG RESETSTAT.
    pub fn reset(&self) {
        for w in &self.workers {
            w.reset();
        }
        self.total_connections.store(0, Ordering::Relaxed);
        self.rejected.store(0, Ordering::Relaxed);
        self.obuf_limit_disconnections.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_resets_to_the_total_it_saw() {
        let c = Counter::default();
        c.add(3);
        c.add(4);
        assert_eq!(c.get(), 7);
        c.reset();
        assert_eq!(c.get(), 0);
        c.add(2);
        assert_eq!(c.get(), 2);
        c.set_total(20);
        assert_eq!(
            c.get(),
            13,
            "a total set by the writer still counts from the reset"
        );
    }

    /// Resets racing the writer: a read is never more than what was added
    /// since the reset before it began, never wraps, and after the writer
    /// stops a reset reads 0 and new adds count from there.
    #[test]
    fn counter_reset_races_writer() {
        const N: u64 = 200_000;
        let c = Arc::new(Counter::default());
        let w = {
            let c = c.clone();
            std::thread::spawn(move || {
                for _ in 0..N {
                    c.add(1);
                }
            })
        };
        while !w.is_finished() {
            c.reset();
            let v = c.get();
            assert!(v <= N, "read {v}");
        }
        w.join().unwrap();
        assert!(c.get() <= N);
        c.reset();
        assert_eq!(c.get(), 0);
        c.add(5);
        assert_eq!(c.get(), 5);
    }
}
