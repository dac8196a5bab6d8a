//! Cache mode: `maxmemory`, `maxmemory-policy` and eviction (Redis's
//! `evict.c`), for the Redis protocol and the memcached one.
//!
//! # Used memory
//! What INFO's `used_memory` reports: the heap's pages in use (the volatile
//! engine: the process's resident set). Ember frees asynchronously (Bullet
//! applies a delete to its backend when a gleaner gets to it, blocks return
//! to the allocator an epoch later, large collections go to the lazy free,
//! and a slab page counts as used while one block in it is), so the figure
//! does not drop when a key is evicted. An eviction round therefore does what
//! Redis's `performEvictions` does with its own accounting: it computes what
//! must be freed, estimates what each evicted key frees (MEMORY USAGE's
//! estimate) and stops when the estimates add up. What it freed is kept as a
//! *credit*: room made that the used memory does not show. Each write
//! spends its size from it, less what the used memory grew since the last
//! look (a write that reused freed room filled it; one that grew the heap
//! while the frees were not visible yet left it, and its growth is already
//! in the excess), and the credit never exceeds the current excess
//! (so it shrinks as the frees become visible). A round evicts only what
//! the excess is beyond the credit. So once at the limit about as much is
//! evicted as is written, and the heap settles near the limit instead of
//! being emptied by rounds that cannot see their own effect (or growing
//! because each round sees only the growth that reuse left).
//!
//! # The limit
//! `maxmemory` when set. With `maxmemory 0` and a policy other than
//! `noeviction`, the heap's own capacity is the limit: `heap-max-size` less
//! a margin of 1/8 (at least 1 MiB), so that a cache evicts before the heap
//! refuses writes for lack of room (a cache must evict, not error); a write
//! the heap refuses anyway (its free pages too scattered for an allocation)
//! lowers that limit to 1/64 of the heap below the memory then used.
//!
//! # Access tracking
//! Redis keeps a 24-bit LRU clock or an LFU counter in every object. Ember's
//! values live in the persistent heap, where a stamp per read would turn
//! reads into persistent writes. [`Access`] is a DRAM array of 2^20 32-bit
//! stamps indexed by a hash of the store key: a read stores one (LRU: the
//! time in milliseconds; LFU: Redis's 16-bit minute clock and 8-bit
//! logarithmic counter) with relaxed atomics. Keys that share a slot share a
//! stamp (the more recent access, or the sum of the frequencies): a cold key
//! may look as hot as its neighbour, never the reverse. Nothing of it is
//! persistent: after a restart every key is "unknown", which counts as idle
//! since before the start (LRU) or as never read (LFU), so the keys read
//! since the restart are kept first.
//!
//! # Sampling
//! As Redis: each round samples `maxmemory-samples` keys (allkeys-*: from a
//! random position of the store's scan, every database; volatile-*: from a
//! random position of the TTL index) into a pool of the 16 best candidates,
//! and evicts the pool's best that still exists. The random policies evict
//! the first eligible sampled key.
//!
//! # When
//! Before a command that may grow the heap (flagged `denyoom`, or queued in
//! MULTI, or EXEC of a transaction holding one), and before a script (which
//! is then refused its first `denyoom` command if the round could not free
//! enough, until it wrote something: Redis's rule). A round that cannot free
//! enough (`noeviction`, or volatile-* with no key with a TTL left) makes a
//! `denyoom` command fail with Redis's `-OOM command not allowed when used
//! memory > 'maxmemory'.` Reads never evict (only writes grow the heap).
//! Each eviction is an ordinary delete applied through the worker's
//! keyspace, durable before the command's reply like any write, counted in
//! INFO `evicted_keys` and published as an `evicted` keyspace event. Rounds
//! are serialised by a mutex: two workers short of room do not both evict
//! for the same shortage (the second sees the first's credit).

use crate::cmd::{CmdError, Ctx, Flags, Spec};
use crate::keyspace::{KsError, PIECE_PREFIX};
use crate::server::{Client, Shared};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A `maxmemory-policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    VolatileLru,
    VolatileLfu,
    VolatileRandom,
    VolatileTtl,
    AllkeysLru,
    AllkeysLfu,
    AllkeysRandom,
    NoEviction,
}

/// Every policy, in the order Redis lists them in its error text.
pub const POLICIES: [Policy; 8] = [
    Policy::VolatileLru,
    Policy::VolatileLfu,
    Policy::VolatileRandom,
    Policy::VolatileTtl,
    Policy::AllkeysLru,
    Policy::AllkeysLfu,
    Policy::AllkeysRandom,
    Policy::NoEviction,
];

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::VolatileLru => "volatile-lru",
            Policy::VolatileLfu => "volatile-lfu",
            Policy::VolatileRandom => "volatile-random",
            Policy::VolatileTtl => "volatile-ttl",
            Policy::AllkeysLru => "allkeys-lru",
            Policy::AllkeysLfu => "allkeys-lfu",
            Policy::AllkeysRandom => "allkeys-random",
            Policy::NoEviction => "noeviction",
        }
    }

    /// Case-insensitive, as Redis's enum parameters.
    pub fn parse(s: &str) -> Option<Policy> {
        POLICIES
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
    }

    /// Redis's error for any other value.
    pub fn invalid() -> String {
        let names: Vec<&str> = POLICIES.iter().map(|p| p.name()).collect();
        format!(
            "argument(s) must be one of the following: {}",
            names.join(", ")
        )
    }

    /// Only keys with a TTL may be evicted.
    pub fn volatile(self) -> bool {
        matches!(
            self,
            Policy::VolatileLru
                | Policy::VolatileLfu
                | Policy::VolatileRandom
                | Policy::VolatileTtl
        )
    }

    /// Access is tracked as a frequency (OBJECT FREQ) rather than a time.
    pub fn lfu(self) -> bool {
        matches!(self, Policy::VolatileLfu | Policy::AllkeysLfu)
    }

    fn random(self) -> bool {
        matches!(self, Policy::VolatileRandom | Policy::AllkeysRandom)
    }

    fn index(self) -> u8 {
        POLICIES.iter().position(|p| *p == self).unwrap_or(7) as u8
    }
}

/// Redis's `EVPOOL_SIZE`.
pub const POOL_SIZE: usize = 16;
/// Redis's `LFU_INIT_VAL`: the counter of a key just created.
pub const LFU_INIT_VAL: u8 = 5;
/// Slots of the access table (4 MiB of stamps).
const SLOTS: usize = 1 << 20;
/// Set in every LFU stamp, so that no stamp is 0 ("unknown").
const LFU_KNOWN: u32 = 1 << 31;
/// Keys sampled at most per round, whatever `maxmemory-samples` says.
const MAX_SAMPLES: usize = 1024;

/// The DRAM access stamps (see the module's text). 0 means unknown.
pub struct Access {
    slots: Box<[AtomicU32]>,
    hasher: foldhash::fast::RandomState,
    lfu: AtomicBool,
    log_factor: AtomicU32,
    decay_time: AtomicU32,
}

impl Default for Access {
    fn default() -> Self {
        Access::new()
    }
}

/// The LRU stamp of Unix time `now_ms` (never 0).
fn lru_stamp(now_ms: i64) -> u32 {
    (now_ms as u32).max(1)
}

/// Redis's `LFUGetTimeInMinutes`.
fn lfu_minutes(now_ms: i64) -> u32 {
    ((now_ms / 60_000) as u32) & 0xFFFF
}

impl Access {
    pub fn new() -> Access {
        Access {
            slots: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
            hasher: foldhash::fast::RandomState::default(),
            lfu: AtomicBool::new(false),
            log_factor: AtomicU32::new(10),
            decay_time: AtomicU32::new(1),
        }
    }

    fn slot(&self, skey: &[u8]) -> &AtomicU32 {
        let h = std::hash::BuildHasher::hash_one(&self.hasher, skey) as usize;
        &self.slots[h & (SLOTS - 1)]
    }

    /// Sets the tracking mode and Redis's LFU parameters; a change of mode
    /// forgets every stamp (an LRU time read as a frequency means nothing).
    pub fn configure(&self, lfu: bool, log_factor: u32, decay_time: u32) {
        self.log_factor.store(log_factor, Ordering::Relaxed);
        self.decay_time.store(decay_time, Ordering::Relaxed);
        if self.lfu.swap(lfu, Ordering::Relaxed) != lfu {
            for s in self.slots.iter() {
                s.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Whether stamps are LFU counters.
    pub fn lfu(&self) -> bool {
        self.lfu.load(Ordering::Relaxed)
    }

    /// Records an access (a read, or a write) of `skey` at `now_ms`: LRU, one
    /// relaxed store; LFU, Redis's `updateLFU` (decay, then a logarithmic
    /// increment), a load and a store (a concurrent access may be lost).
    pub fn touch(&self, skey: &[u8], now_ms: i64) {
        let s = self.slot(skey);
        if !self.lfu() {
            s.store(lru_stamp(now_ms), Ordering::Relaxed);
            return;
        }
        let old = s.load(Ordering::Relaxed);
        let c = if old == 0 {
            LFU_INIT_VAL
        } else {
            self.log_incr(self.decayed(old, now_ms))
        };
        s.store(
            LFU_KNOWN | (lfu_minutes(now_ms) << 8) | u32::from(c),
            Ordering::Relaxed,
        );
    }

    /// Forgets `skey`'s stamp (it was deleted: a key created there later
    /// starts afresh).
    pub fn forget(&self, skey: &[u8]) {
        self.slot(skey).store(0, Ordering::Relaxed);
    }

    /// Milliseconds since `skey` was last accessed; None when unknown (not
    /// accessed since the start, or its stamp was forgotten). LRU mode only.
    pub fn idle_ms(&self, skey: &[u8], now_ms: i64) -> Option<u64> {
        let v = self.slot(skey).load(Ordering::Relaxed);
        if v == 0 || self.lfu() {
            return None;
        }
        // Signed: a stamp a little ahead (another worker's later clock)
        // is "just now"; idle times wrap after 24 days.
        Some((lru_stamp(now_ms).wrapping_sub(v) as i32).max(0) as u64)
    }

    /// Redis's `LFUDecrAndReturn` of `skey`'s counter (0 when unknown).
    pub fn freq(&self, skey: &[u8], now_ms: i64) -> u8 {
        let v = self.slot(skey).load(Ordering::Relaxed);
        if v & LFU_KNOWN == 0 {
            return 0;
        }
        self.decayed(v, now_ms)
    }

    fn decayed(&self, v: u32, now_ms: i64) -> u8 {
        let ldt = (v >> 8) & 0xFFFF;
        let counter = v & 0xFF;
        let now = lfu_minutes(now_ms);
        let elapsed = if now >= ldt {
            now - ldt
        } else {
            65535 - ldt + now
        };
        let decay = self.decay_time.load(Ordering::Relaxed);
        let periods = elapsed.checked_div(decay).unwrap_or(0);
        counter.saturating_sub(periods) as u8
    }

    /// Redis's `LFULogIncr`.
    fn log_incr(&self, c: u8) -> u8 {
        if c == 255 {
            return 255;
        }
        let r: f64 = rand::random();
        let base = f64::from(c.saturating_sub(LFU_INIT_VAL));
        let p = 1.0 / (base * f64::from(self.log_factor.load(Ordering::Relaxed)) + 1.0);
        if r < p {
            c + 1
        } else {
            c
        }
    }
}

/// The eviction pool and what the rounds keep between them.
#[derive(Default)]
struct Round {
    /// Candidates, best (highest score) last: (score, store key).
    pool: Vec<(u64, Vec<u8>)>,
}

impl Round {
    fn offer(&mut self, score: u64, skey: Vec<u8>) {
        if self.pool.iter().any(|(_, k)| *k == skey) {
            return;
        }
        if self.pool.len() == POOL_SIZE {
            if score <= self.pool[0].0 {
                return;
            }
            self.pool.remove(0);
        }
        let at = self.pool.partition_point(|(s, _)| *s <= score);
        self.pool.insert(at, (score, skey));
    }
}

/// The shared eviction state (in [`Shared`]).
pub struct Evictor {
    maxmemory: AtomicU64,
    policy: AtomicU8,
    samples: AtomicU32,
    tenacity: AtomicU32,
    /// The heap's capacity less the margin (u64::MAX without a heap),
    /// lowered each time the heap refused a write anyway.
    heap_limit: AtomicU64,
    heap_max: u64,
    /// `keyspace::OOM_ERRORS` when last looked at.
    oom_seen: AtomicU64,
    /// Estimated bytes evicted that the used memory may not show yet and
    /// that writes have not filled.
    credit: AtomicU64,
    /// The used memory at the last [`make_room_for`] over the limit.
    last_used: AtomicU64,
    /// The running average of evicted keys' estimates: the size assumed for
    /// a write whose size is not given ([`make_room`]).
    avg_key: AtomicU64,
    round: Mutex<Round>,
    evicted: AtomicU64,
    /// `evicted` at the last CONFIG RESETSTAT.
    evicted_base: AtomicU64,
    /// When the heap's empty slabs were last reclaimed (ms since the start).
    reclaimed_at: AtomicU64,
    started: Instant,
}

impl Evictor {
    /// The state for a configuration; `heap_max`: the heap's largest size
    /// (None: the volatile engine).
    pub fn new(cfg: &crate::Config, heap_max: Option<u64>) -> Evictor {
        let heap_limit = heap_max.map_or(u64::MAX, |m| m - (m / 8).max(1 << 20).min(m / 2));
        let e = Evictor {
            maxmemory: AtomicU64::new(0),
            policy: AtomicU8::new(Policy::NoEviction.index()),
            samples: AtomicU32::new(5),
            tenacity: AtomicU32::new(10),
            heap_limit: AtomicU64::new(heap_limit),
            heap_max: heap_max.unwrap_or(u64::MAX),
            oom_seen: AtomicU64::new(0),
            credit: AtomicU64::new(0),
            last_used: AtomicU64::new(0),
            avg_key: AtomicU64::new(1024),
            round: Mutex::new(Round::default()),
            evicted: AtomicU64::new(0),
            evicted_base: AtomicU64::new(0),
            reclaimed_at: AtomicU64::new(0),
            started: Instant::now(),
        };
        e.configure(cfg, None);
        e
    }

    /// Takes the configuration's eviction parameters (at start and after
    /// CONFIG SET); `access`: the access table to switch between LRU and
    /// LFU.
    pub fn configure(&self, cfg: &crate::Config, access: Option<&Access>) {
        self.maxmemory.store(cfg.maxmemory, Ordering::Relaxed);
        self.policy
            .store(cfg.maxmemory_policy.index(), Ordering::Relaxed);
        self.samples
            .store(cfg.maxmemory_samples as u32, Ordering::Relaxed);
        self.tenacity
            .store(cfg.maxmemory_eviction_tenacity as u32, Ordering::Relaxed);
        if let Some(a) = access {
            a.configure(
                cfg.maxmemory_policy.lfu(),
                cfg.lfu_log_factor as u32,
                cfg.lfu_decay_time as u32,
            );
        }
    }

    pub fn policy(&self) -> Policy {
        POLICIES[self.policy.load(Ordering::Relaxed) as usize]
    }

    /// The memory limit in force: None when nothing is limited.
    pub fn limit(&self) -> Option<u64> {
        let m = self.maxmemory.load(Ordering::Relaxed);
        let evicts = self.policy() != Policy::NoEviction;
        let heap = self.heap_limit.load(Ordering::Relaxed);
        match (m, evicts) {
            (0, false) => None,
            (0, true) => (heap != u64::MAX).then_some(heap),
            (m, true) => Some(m.min(heap)),
            (m, false) => Some(m),
        }
    }

    /// Keys evicted since the start (or the last CONFIG RESETSTAT): INFO's
    /// `evicted_keys`, memcached's `evictions`.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed) - self.evicted_base.load(Ordering::Relaxed)
    }

    /// CONFIG RESETSTAT.
    pub fn reset_stats(&self) {
        self.evicted_base
            .store(self.evicted.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Redis's `evictionTimeLimitUs` for the tenacity.
    fn time_limit_us(&self) -> u64 {
        let t = u64::from(self.tenacity.load(Ordering::Relaxed));
        if t <= 10 {
            50 * t
        } else if t < 100 {
            (500.0 * 1.15f64.powi(t as i32 - 10)) as u64
        } else {
            u64::MAX
        }
    }
}

/// The keys evicted so far (see [`Evictor::evicted`]).
pub fn evicted_total(sh: &Shared) -> u64 {
    sh.evict.evicted()
}

/// Used memory as INFO `used_memory` reports it.
pub fn used_memory(sh: &Shared) -> u64 {
    match sh.store.heap() {
        Some(h) => crate::info::heap_used(h),
        None => crate::info::rss_bytes(),
    }
}

/// Redis's reply when a round could not free enough.
pub fn oom() -> CmdError {
    CmdError::OomMaxmemory
}

/// Called before every command outside a unit (a transaction's or a
/// script's commands run inside one): runs an eviction round when the
/// command may grow the heap, and refuses it when the round could not free
/// enough and Redis would refuse it (see the module's text).
pub fn before_command(
    ctx: &mut Ctx,
    c: &Client,
    spec: &Spec,
    args: &[Vec<u8>],
) -> Result<(), CmdError> {
    ctx.ks.pre_oom = false;
    if ctx.sh.evict.limit().is_none() {
        return Ok(());
    }
    let name = spec.name;
    let script = matches!(name, "eval" | "evalsha" | "fcall");
    let deny = match &c.multi {
        Some(m) if name == "exec" => m.cmds.iter().any(|a| {
            crate::cmd::lookup(&a[0])
                .is_some_and(|i| crate::cmd::TABLE[i].flags.contains(Flags::DENYOOM))
        }),
        Some(_) => !matches!(name, "discard" | "quit" | "reset"),
        None => spec.flags.contains(Flags::DENYOOM),
    };
    if !deny && !script {
        return Ok(());
    }
    // The write's size, about: its arguments and an entry's overhead.
    let args_bytes =
        args[1..].iter().map(|a| a.len() as u64).sum::<u64>() + crate::coll::PIECE_OVERHEAD;
    match make_room_for(ctx, args_bytes) {
        Err(e) if deny => Err(e),
        Err(_) => {
            ctx.ks.pre_oom = true;
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

/// Whether a script's command must be refused for lack of memory: a
/// `denyoom` command of a script whose start found the memory full, before
/// the script wrote anything (Redis's `scriptVerifyOOM`).
pub fn script_refuses(ctx: &Ctx, spec: &Spec) -> bool {
    ctx.ks.pre_oom && spec.flags.contains(Flags::DENYOOM) && !ctx.ks.has_staged()
}

/// [`make_room_for`] a write of the size of an average evicted key.
pub fn make_room(ctx: &mut Ctx) -> Result<(), CmdError> {
    let bytes = ctx.sh.evict.avg_key.load(Ordering::Relaxed);
    make_room_for(ctx, bytes)
}

/// Makes room for a write of about `bytes`: when the used memory exceeds the
/// limit by more than the credit of earlier rounds (less this write),
/// evicts keys by the policy until their estimated sizes cover the
/// shortage, or the tenacity's time limit passes (the command then runs and
/// the next one goes on). Fails with Redis's OOM error when the policy is
/// `noeviction` or no key is left to evict. Inside a unit it does nothing
/// (the unit's runner made room before it began).
pub fn make_room_for(ctx: &mut Ctx, bytes: u64) -> Result<(), CmdError> {
    let sh = ctx.sh;
    let ev = &sh.evict;
    // Nor while clients are paused: the dataset stays as it is (Redis 7.0's
    // `isSafeToPerformEvictions`).
    if ctx.ks.in_unit() || sh.hk.paused() {
        return Ok(());
    }
    let Some(mut limit) = ev.limit() else {
        return Ok(());
    };
    // The heap refused a write although the used memory was under the
    // limit (its free pages too scattered for the allocation): under a
    // policy that evicts, the heap's limit comes down to 1/64 of it below
    // the memory used now, so that the next writes evict.
    let ooms = crate::keyspace::OOM_ERRORS.load(Ordering::Relaxed);
    if ooms != ev.oom_seen.load(Ordering::Relaxed) {
        ev.oom_seen.store(ooms, Ordering::Relaxed);
        if ev.policy() != Policy::NoEviction && ev.heap_max != u64::MAX {
            let lower = used_memory(sh).saturating_sub(ev.heap_max / 64);
            ev.heap_limit
                .fetch_min(lower.max(ev.heap_max / 2), Ordering::Relaxed);
            limit = ev.limit().unwrap_or(limit);
        }
    }
    let used = used_memory(sh);
    let grown = used.saturating_sub(ev.last_used.swap(used, Ordering::Relaxed));
    if used <= limit {
        if ev.credit.load(Ordering::Relaxed) != 0 {
            ev.credit.store(0, Ordering::Relaxed);
        }
        return Ok(());
    }
    let excess = used - limit;
    // This write spends its size from the room earlier rounds made (which
    // may exceed the excess by a round's last key), less what the used
    // memory grew since the last look: a write that grew the heap (its
    // room's frees not visible yet) left that room unfilled, and counting
    // it both in the excess and against the credit would evict twice what
    // is written for as long as the frees lag (the cache emptied by a
    // starved gleaner or a slow msync).
    let write = bytes;
    let bytes = bytes.saturating_sub(grown);
    let cap = excess + 2 * ev.avg_key.load(Ordering::Relaxed);
    let spend = |c: u64| c.min(cap).saturating_sub(bytes);
    let before = ev
        .credit
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(spend(c)))
        .unwrap_or_else(|c| c);
    if excess <= spend(before) {
        return Ok(());
    }
    let mut round = ev.round.lock().unwrap_or_else(|p| p.into_inner());
    // The allocator returns empty slabs' pages only when it runs out of
    // free pages: give them back now (at most every 100 ms), so that what
    // deletes emptied stops counting.
    let ms = ev.started.elapsed().as_millis() as u64;
    if ms >= ev.reclaimed_at.load(Ordering::Relaxed) + 100 {
        ev.reclaimed_at.store(ms, Ordering::Relaxed);
        if let Some(h) = sh.store.heap() {
            h.reclaim_empty_slabs();
        }
    }
    // Again under the lock: another worker's round may have made room.
    let used = used_memory(sh);
    let excess = used.saturating_sub(limit);
    let cap = excess + 2 * ev.avg_key.load(Ordering::Relaxed);
    let credit = ev.credit.load(Ordering::Relaxed).min(cap);
    let mut need = excess.saturating_sub(credit);
    // While earlier rounds' frees are in flight (a credit), a jump of the
    // used memory is mostly transient: a gleaner's batch allocates its
    // records' values before it frees what they replace or delete, and with
    // msync a batch is thousands of records. Evicting the whole jump at once
    // would empty a cache as small as a batch; at most twice the write per
    // round still brings the memory down (each write evicts more than it
    // adds) and leaves the transient to pass. Without a credit (the limit
    // just crossed, or CONFIG SET lowered it) the whole excess is evicted,
    // as Redis does.
    if credit > 0 {
        need = need.min(2 * write.max(ev.avg_key.load(Ordering::Relaxed)));
    }
    if need == 0 {
        ev.credit.store(credit, Ordering::Relaxed);
        return Ok(());
    }
    let policy = ev.policy();
    if policy == Policy::NoEviction {
        ev.credit.store(credit, Ordering::Relaxed);
        return Err(oom());
    }
    let start = Instant::now();
    let time_limit = ev.time_limit_us();
    let (mut freed, mut keys) = (0u64, 0u64);
    let mut result = Ok(());
    while freed < need {
        match evict_one(ctx, &mut round, policy, start, time_limit) {
            Ok(Victim::Evicted(bytes)) => {
                freed += bytes;
                keys += 1;
            }
            Ok(Victim::None) => {
                result = Err(oom());
                break;
            }
            // Keys exist that the samples did not find in time (keys just
            // written that a scan does not show yet, or a TTL index still
            // being rebuilt): the command runs, as when the time limit
            // cuts a round short.
            Ok(Victim::NotFound) => break,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        if keys.is_multiple_of(16) && start.elapsed().as_micros() as u64 > time_limit {
            break;
        }
    }
    ev.credit.store(credit + freed, Ordering::Relaxed);
    drop(round);
    if let Some(per_key) = freed.checked_div(keys) {
        let avg = ev.avg_key.load(Ordering::Relaxed);
        ev.avg_key.store((avg * 7 + per_key) / 8, Ordering::Relaxed);
        crate::notify::flush_pending(sh, ctx.ks);
    }
    result
}

/// Store keys sampled for the policy: `n` database keys from a random
/// position of the store's scan, or of the TTL index for volatile-*.
fn sample(ctx: &mut Ctx, volatile: bool, n: usize, out: &mut Vec<Vec<u8>>) -> Result<(), KsError> {
    out.clear();
    if volatile {
        ctx.sh.hk.random_ttl_keys(n, out);
        return Ok(());
    }
    let mut cursor: u64 = rand::random::<u64>() | 1;
    let mut page = Vec::new();
    // A step may return internal keys only (a large collection's pieces),
    // or none after a run of empty buckets: a few more steps, wrapping
    // round once.
    let mut wrapped = false;
    for _ in 0..16 {
        page.clear();
        let next = ctx.ks.sess.scan(cursor, n.max(16), &mut page)?;
        for k in page.drain(..) {
            if k.first().is_some_and(|&b| b != PIECE_PREFIX) && !out.contains(&k) {
                out.push(k);
            }
        }
        if out.len() >= n {
            out.truncate(n);
            break;
        }
        if next == 0 {
            if wrapped {
                break;
            }
            wrapped = true;
        }
        cursor = next;
    }
    Ok(())
}

/// What [`evict_one`] did.
enum Victim {
    /// Evicted a key of about this many bytes.
    Evicted(u64),
    /// No key is eligible (by the key counts).
    None,
    /// Eligible keys exist, but the samples found none before the time
    /// limit (or 1,024 rounds).
    NotFound,
}

/// Evicts one key by `policy`.
fn evict_one(
    ctx: &mut Ctx,
    round: &mut Round,
    policy: Policy,
    start: Instant,
    time_limit: u64,
) -> Result<Victim, CmdError> {
    let n = (ctx.sh.evict.samples.load(Ordering::Relaxed) as usize).clamp(1, MAX_SAMPLES);
    let mut keys = Vec::new();
    // Rounds of sampling until a key is evicted. The key counts say when
    // there is none to find (an empty store, or no key with a TTL); samples
    // may be stale (keys deleted that a scan or the TTL index still shows),
    // so a bounded number of rounds is tried before giving up.
    if eligible(ctx.sh, policy) == 0 {
        return Ok(Victim::None);
    }
    for i in 0..1024 {
        if i % 16 == 15 && start.elapsed().as_micros() as u64 > time_limit.max(2000) {
            break;
        }
        sample(ctx, policy.volatile(), n, &mut keys)?;
        if policy.random() {
            for k in &keys {
                if let Some(bytes) = evict_key(ctx, k, policy)? {
                    return Ok(Victim::Evicted(bytes));
                }
            }
            continue;
        }
        let now = crate::keyspace::now_ms();
        for k in keys.drain(..) {
            if let Some(score) = score(ctx, &k, policy, now)? {
                round.offer(score, k);
            }
        }
        while let Some((_, k)) = round.pool.pop() {
            if let Some(bytes) = evict_key(ctx, &k, policy)? {
                return Ok(Victim::Evicted(bytes));
            }
        }
    }
    Ok(Victim::NotFound)
}

/// Keys the policy may evict, by the key counts (every key, or those with
/// a TTL); u64::MAX while the counts are not known (a recount runs).
fn eligible(sh: &Shared, policy: Policy) -> u64 {
    let mut n = 0;
    for db in 0..=u8::MAX - 1 {
        match sh.counts.get(db) {
            Some((keys, ttls)) => n += if policy.volatile() { ttls } else { keys },
            None => return u64::MAX,
        }
    }
    n
}

/// A candidate's score (higher: evicted first), None when it is not
/// eligible (gone, or without a TTL under a volatile policy).
fn score(ctx: &mut Ctx, skey: &[u8], policy: Policy, now: i64) -> Result<Option<u64>, CmdError> {
    let (found, expired) = ctx.ks.lookup_raw(skey, now)?;
    let expire = match found {
        Some(h) => h.expire,
        // Found expired: the best candidate there is.
        None if expired => return Ok(Some(u64::MAX)),
        None => None,
    };
    if expire.is_none() && (policy.volatile() || found.is_none()) {
        if policy.volatile() {
            // A stale entry of the TTL index: dropped under the key's lock
            // (a writer adds under it), so that sampling finds live ones.
            let _g = ctx.sh.stripes.lock(skey);
            if let Ok((f, false)) = ctx.ks.lookup_raw(skey, now) {
                if f.is_none_or(|h| h.expire.is_none()) {
                    ctx.sh.hk.forget(skey);
                }
            }
        }
        return Ok(None);
    }
    let access = &ctx.sh.hk.access;
    Ok(Some(match policy {
        Policy::VolatileTtl => u64::MAX - expire.unwrap_or(0).max(0) as u64,
        Policy::VolatileLfu | Policy::AllkeysLfu => 255 - u64::from(access.freq(skey, now)),
        // Unknown: idle since before the start, older than any stamp.
        _ => access.idle_ms(skey, now).unwrap_or(u64::MAX / 2),
    }))
}

/// Evicts `skey` if it is still eligible: a durable delete under its stripe
/// lock, counted and notified. Returns the estimate of what it freed
/// (MEMORY USAGE's).
fn evict_key(ctx: &mut Ctx, skey: &[u8], policy: Policy) -> Result<Option<u64>, CmdError> {
    let sh = ctx.sh;
    let now = crate::keyspace::now_ms();
    let _g = sh.stripes.lock(skey);
    let (found, expired) = ctx.ks.lookup_raw(skey, now)?;
    let Some(h) = found else {
        if expired {
            // An expired key is removed as expired, not evicted; it frees
            // as much.
            let bytes = (skey.len() + ctx.ks.raw.len()) as u64 + crate::coll::PIECE_OVERHEAD;
            ctx.ks.delete(skey, now)?;
            ctx.ks.apply()?;
            return Ok(Some(bytes));
        }
        return Ok(None);
    };
    if policy.volatile() && h.expire.is_none() {
        return Ok(None);
    }
    let raw = std::mem::take(&mut ctx.ks.raw);
    let pieces = crate::coll::pieces_usage(ctx.ks, h.kind, &raw[h.off..], 5);
    let bytes = (skey.len() + raw.len()) as u64 + crate::coll::PIECE_OVERHEAD + pieces?;
    ctx.ks.raw = raw;
    ctx.ks.delete(skey, now)?;
    ctx.ks.apply()?;
    if h.expire.is_some() {
        sh.hk.forget(skey);
    }
    drop(_g);
    sh.evict.evicted.fetch_add(1, Ordering::Relaxed);
    crate::notify::event(ctx, crate::notify::EVICTED, "evicted", skey[0], &skey[1..]);
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_print_as_redis() {
        for p in POLICIES {
            assert_eq!(Policy::parse(p.name()), Some(p));
            assert_eq!(Policy::parse(&p.name().to_uppercase()), Some(p));
        }
        assert_eq!(Policy::parse("lru"), None);
        assert_eq!(
            Policy::invalid(),
            "argument(s) must be one of the following: volatile-lru, volatile-lfu, volatile-random, volatile-ttl, allkeys-lru, allkeys-lfu, allkeys-random, noeviction"
        );
        assert!(Policy::VolatileTtl.volatile() && !Policy::AllkeysLfu.volatile());
        assert!(Policy::AllkeysLfu.lfu() && !Policy::AllkeysLru.lfu());
    }

    #[test]
    fn lru_stamps_measure_idle_time() {
        let a = Access::new();
        let t = 1_700_000_000_000i64;
        assert_eq!(a.idle_ms(b"\0k", t), None, "unknown before any access");
        a.touch(b"\0k", t);
        assert_eq!(a.idle_ms(b"\0k", t + 1500), Some(1500));
        // A stamp ahead of the reader's clock reads as just accessed.
        assert_eq!(a.idle_ms(b"\0k", t - 10), Some(0));
        a.forget(b"\0k");
        assert_eq!(a.idle_ms(b"\0k", t), None);
    }

    #[test]
    fn lfu_counters_grow_logarithmically_and_decay() {
        let a = Access::new();
        a.configure(true, 10, 1);
        let t = 1_700_000_000_000i64;
        assert_eq!(a.freq(b"\0k", t), 0);
        a.touch(b"\0k", t);
        assert_eq!(a.freq(b"\0k", t), LFU_INIT_VAL);
        for _ in 0..1000 {
            a.touch(b"\0k", t);
        }
        let f = a.freq(b"\0k", t);
        // Redis's table for lfu-log-factor 10: about 10 at 100 hits, 18 at 1000.
        assert!((10..=30).contains(&f), "{f}");
        // One per lfu-decay-time minute.
        assert_eq!(a.freq(b"\0k", t + 3 * 60_000), f - 3);
        assert_eq!(a.freq(b"\0k", t + 1000 * 60_000), 0);
        // A change of mode forgets the stamps.
        a.configure(false, 10, 1);
        assert_eq!(a.idle_ms(b"\0k", t), None);
    }

    #[test]
    fn the_pool_keeps_the_best_candidates() {
        let mut r = Round::default();
        for i in 0..40u64 {
            r.offer((i * 7) % 41, vec![i as u8]);
        }
        r.offer(1000, vec![200]);
        r.offer(1000, vec![200]);
        assert_eq!(r.pool.len(), POOL_SIZE);
        assert!(r.pool.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(r.pool.last().unwrap(), &(1000, vec![200]));
        assert!(r.pool[0].0 >= 40 * 7 % 41 - 16 || r.pool[0].0 > 20);
    }

    #[test]
    fn tenacity_time_limits_as_redis() {
        let cfg = crate::Config::default();
        let e = Evictor::new(&cfg, None);
        assert_eq!(e.time_limit_us(), 500);
        e.tenacity.store(0, Ordering::Relaxed);
        assert_eq!(e.time_limit_us(), 0);
        e.tenacity.store(100, Ordering::Relaxed);
        assert_eq!(e.time_limit_us(), u64::MAX);
        e.tenacity.store(11, Ordering::Relaxed);
        assert_eq!(e.time_limit_us(), 575);
    }

    #[test]
    fn the_limit_follows_the_policy_and_the_heap() {
        let mut cfg = crate::Config::default();
        let e = Evictor::new(&cfg, Some(64 << 20));
        assert_eq!(e.limit(), None);
        cfg.maxmemory_policy = Policy::AllkeysLru;
        e.configure(&cfg, None);
        assert_eq!(e.limit(), Some(56 << 20));
        cfg.maxmemory = 1 << 40;
        e.configure(&cfg, None);
        assert_eq!(e.limit(), Some(56 << 20));
        cfg.maxmemory = 1 << 20;
        cfg.maxmemory_policy = Policy::NoEviction;
        e.configure(&cfg, None);
        assert_eq!(e.limit(), Some(1 << 20));
    }
}
