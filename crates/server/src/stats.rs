//! Counters for INFO, CONFIG RESETSTAT and the metrics endpoint. Each worker
//! writes only its own [`WorkerStats`] (no cache line shared between workers on
//! the request path); readers add them up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Upper bounds (µs) of the latency histogram buckets (the last is +Inf).
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 1_000_000,
];

/// Per-command counters.
#[derive(Default)]
pub struct CmdStat {
    pub calls: AtomicU64,
    pub usec: AtomicU64,
    pub failed: AtomicU64,
    pub rejected: AtomicU64,
}

/// One worker's counters.
pub struct WorkerStats {
    pub cmds: Vec<CmdStat>,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub net_in: AtomicU64,
    pub net_out: AtomicU64,
    pub expired_keys: AtomicU64,
    /// Group commits handed to the worker's syncer thread (msync mode).
    pub commits_pipelined: AtomicU64,
    /// Count per latency bucket (`LATENCY_BOUNDS_US.len() + 1`).
    pub latency: Vec<AtomicU64>,
    pub latency_sum_us: AtomicU64,
}

impl WorkerStats {
    fn new() -> WorkerStats {
        WorkerStats {
            cmds: (0..crate::cmd::TABLE.len())
                .map(|_| CmdStat::default())
                .collect(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            net_in: AtomicU64::new(0),
            net_out: AtomicU64::new(0),
            expired_keys: AtomicU64::new(0),
            commits_pipelined: AtomicU64::new(0),
            latency: (0..=LATENCY_BOUNDS_US.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            latency_sum_us: AtomicU64::new(0),
        }
    }

    #[inline]
    pub fn record(&self, cmd: usize, us: u64, failed: bool) {
        let c = &self.cmds[cmd];
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.usec.fetch_add(us, Ordering::Relaxed);
        if failed {
            c.failed.fetch_add(1, Ordering::Relaxed);
        }
        let b = LATENCY_BOUNDS_US
            .iter()
            .position(|&u| us <= u)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        self.latency[b].fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    fn reset(&self) {
        for c in &self.cmds {
            c.calls.store(0, Ordering::Relaxed);
            c.usec.store(0, Ordering::Relaxed);
            c.failed.store(0, Ordering::Relaxed);
            c.rejected.store(0, Ordering::Relaxed);
        }
        for a in [&self.hits, &self.misses, &self.net_in, &self.net_out] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

/// Server-wide counters.
pub struct Stats {
    pub workers: Vec<Arc<WorkerStats>>,
    pub total_connections: AtomicU64,
    pub rejected: AtomicU64,
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
        }
    }

    pub fn totals(&self) -> Totals {
        let n = crate::cmd::TABLE.len();
        let mut t = Totals {
            per_cmd: vec![(0, 0, 0, 0); n],
            latency: vec![0; LATENCY_BOUNDS_US.len() + 1],
            ..Default::default()
        };
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for w in &self.workers {
            t.hits += ld(&w.hits);
            t.misses += ld(&w.misses);
            t.net_in += ld(&w.net_in);
            t.net_out += ld(&w.net_out);
            t.expired_keys += ld(&w.expired_keys);
            t.commits_pipelined += ld(&w.commits_pipelined);
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
    }
}
