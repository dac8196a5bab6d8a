//! Bullet's variants and options.

use crate::direct::BackendOptions;
use crate::{Error, Result};
use std::time::Duration;

/// Bullet's variants, as in the paper's ablation (§7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    St,
    Lfr,
    Opt,
    Dyn,
    Full,
}

impl Variant {
    pub const ALL: [Variant; 5] = [
        Variant::St,
        Variant::Lfr,
        Variant::Opt,
        Variant::Dyn,
        Variant::Full,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::St => "st",
            Variant::Lfr => "lfr",
            Variant::Opt => "opt",
            Variant::Dyn => "dyn",
            Variant::Full => "full",
        }
    }

    pub fn parse(s: &str) -> Result<Variant> {
        let s = s.trim_start_matches('+');
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| Error::Config(format!("unknown Bullet variant {s:?}")))
    }

    pub fn lockfree_gets(self) -> bool {
        self != Variant::St
    }
    pub fn tx_on_put_path(self) -> bool {
        matches!(self, Variant::St | Variant::Lfr)
    }
    pub fn dynamic(self) -> bool {
        matches!(self, Variant::Dyn | Variant::Full)
    }
    pub fn collapse(self) -> bool {
        self == Variant::Full
    }
}

/// Configuration of a Bullet store.
#[derive(Clone, Debug)]
pub struct BulletOptions {
    pub variant: Variant,
    /// Logs in the pool (a new store only; an existing one keeps its own).
    pub logs: usize,
    /// Bytes per log (a new store only).
    pub log_size: u64,
    /// The backend of a new store.
    pub backend: BackendOptions,
    /// Initial frontend buckets.
    pub frontend_buckets: usize,
    /// Most frontend entries (0 = unbounded: the frontend is a full copy).
    pub cache_entries: u64,
    /// Epoch length.
    pub epoch: Duration,
    /// Gleaner threads of the static variants (`st`, `lfr`, `opt`).
    pub static_gleaners: usize,
    /// Group commit: [`Session::apply`](crate::Session::apply) returns once
    /// the record is written and flushed, without the fence;
    /// [`Session::commit`](crate::Session::commit) makes every update of
    /// the session durable with one fence (with the msync strategy: one msync
    /// per batch instead of one per write). Other sessions may read an update
    /// before it is durable, as Redis clients read writes before the AOF fsync.
    pub group_commit: bool,
    /// Dynamic variants: 0 = sessions take the gleaner roles between their
    /// requests (§4.3: a thread is a writer or a gleaner); N > 0 = N background
    /// threads take them instead and sessions only serve. For gleaning that waits
    /// on I/O (the msync strategy, where a batch's backend writes cost one
    /// `msync` of many scattered pages): a session holding the role would keep its
    /// clients waiting meanwhile.
    pub role_threads: usize,
    /// A new store allocates every log buffer at once and maps it writable
    /// ([`Pool::preallocate`](crate::crl::Pool::preallocate)); otherwise a
    /// buffer is allocated when a writer first takes its log, and its pages
    /// are faulted in on the way.
    pub preallocate_logs: bool,
    /// Recovery folds the logs' records on two threads from this many records
    /// on (fewer: on the opening thread alone).
    pub parallel_replay_from: usize,
    /// Most bytes of log between heads and tails (the backlog that a restart
    /// after a crash reads and replays), 0 for no bound but the logs' size.
    /// Each log gets an equal share: a writer appends to a log only while
    /// the record keeps it within its share (or the log is empty: a record
    /// larger than a share still goes in), otherwise it takes another log or
    /// gleans and waits as for a full log; and the gleaner roles follow the
    /// occupancy of the bound instead of the logs' capacity. Removes pass
    /// while the backend is full (they free its space).
    pub backlog_limit: u64,
}

impl Default for BulletOptions {
    fn default() -> Self {
        BulletOptions {
            variant: Variant::Full,
            logs: 32,
            log_size: 64 << 20,
            backend: BackendOptions::default(),
            frontend_buckets: 1 << 16,
            cache_entries: 0,
            epoch: Duration::from_millis(10),
            static_gleaners: 1,
            group_commit: false,
            role_threads: 0,
            preallocate_logs: true,
            parallel_replay_from: 20_000,
            backlog_limit: 0,
        }
    }
}
