//! Shared helpers of the index crash-consistency tests (crash_sim, sigkill, model,
//! linearizability), generic over the structures.
//!
//! - [`Kind`]: which structure (and configuration) a test runs on; [`create`] makes
//!   one on a heap (and sets it as the heap root), [`recover`] attaches to the root
//!   of a [`pmem::Recovery`] and runs `index::recover`. Both return an [`Idx`], a
//!   shared `dyn` object with per-thread handles (`Box<dyn index::Ops>`).
//! - Keys and values: a small key space ([`key`]); every written value is unique
//!   and self-describing ([`value`] / [`value_id`]: an id, then filler derived from
//!   the id), so a recovered value names the operation that wrote it and a torn or
//!   foreign value is detected.
//! - [`OpRec`] and [`check_durable`]: the durable-linearizability check of a
//!   recovered state against a history of timestamped operations cut at a crash.
//! - [`check_recovered`], [`read_state`], [`exercise`]: the checks every recovered
//!   structure must pass.
#![allow(dead_code)]

use index::{
    HashOptions, Index, KeyHasher, LfHash, Ops, PHash, PHashOptions, SkipList, SkipOptions,
};
use index::{RecoverStats, Verified};
use pmem::{Geometry, Heap, HeapOptions, PPtr, Recovery, Strategy};
use rand::rngs::SmallRng;
use rand::RngExt;
use std::collections::BTreeMap;
use std::sync::Arc;

// ---- structures ----

/// The structure (and configuration) under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `LfHash` with the link cache.
    Hash,
    /// `LfHash` without the link cache (link-and-persist only).
    HashNoCache,
    /// `SkipList` with the link cache.
    Skip,
    /// `SkipList` without the link cache.
    SkipNoCache,
    /// The lock-based baseline.
    PHash,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Hash,
        Kind::HashNoCache,
        Kind::Skip,
        Kind::SkipNoCache,
        Kind::PHash,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Hash => "hash",
            Kind::HashNoCache => "hash-nocache",
            Kind::Skip => "skip",
            Kind::SkipNoCache => "skip-nocache",
            Kind::PHash => "phash",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Whether every update is durable when it returns (no link cache): `sync` is
    /// then not needed before acknowledging.
    pub fn durable_on_return(self) -> bool {
        !matches!(self, Kind::Hash | Kind::Skip)
    }

    /// A small number identifying the kind (seeds).
    pub fn id(self) -> u64 {
        Kind::ALL.iter().position(|&k| k == self).unwrap() as u64
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The key hash of the tests' tables: a fixed SipHash key, so that bucket
/// layouts (and the keys that share a bucket) are the same in every run.
#[allow(dead_code)] // not every test file hashes keys itself
pub const HASHER: KeyHasher = KeyHasher::sip13(0x5eed_0000_0000_0001, 0x5eed_0000_0000_0002);

/// Hash options of the tests: 4 initial buckets, so that the table grows.
pub fn hash_opts(cache: bool) -> HashOptions {
    HashOptions {
        initial_buckets: 4,
        max_load: 2,
        link_cache: cache,
        hasher: Some(HASHER),
        ..Default::default()
    }
}

pub fn skip_opts(cache: bool) -> SkipOptions {
    SkipOptions {
        link_cache: cache,
        ..Default::default()
    }
}

/// phash with few buckets, so that chains are long.
pub fn phash_opts() -> PHashOptions {
    PHashOptions {
        buckets: 8,
        hasher: Some(HASHER),
    }
}

/// An index structure behind a `dyn` interface (the `Index` trait has an associated
/// handle type). Handles stay on the thread that made them.
pub trait DynIndex: Send + Sync {
    fn handle(&self) -> index::Result<Box<dyn Ops>>;
    fn root(&self) -> PPtr<u8>;
    fn verify(&self, quiescent: bool) -> Result<Verified, String>;
    fn len_estimate(&self) -> u64;
    fn close(&self) -> index::Result<()>;
}

impl<T: Index> DynIndex for T
where
    T::Handle: 'static,
{
    fn handle(&self) -> index::Result<Box<dyn Ops>> {
        Ok(Box::new(Index::handle(self)?))
    }
    fn root(&self) -> PPtr<u8> {
        Index::root(self)
    }
    fn verify(&self, quiescent: bool) -> Result<Verified, String> {
        Index::verify(self, quiescent)
    }
    fn len_estimate(&self) -> u64 {
        Index::len_estimate(self)
    }
    fn close(&self) -> index::Result<()> {
        Index::close(self)
    }
}

pub type Idx = Arc<dyn DynIndex>;

/// Creates an empty structure of `kind` on `heap` and makes it the heap root.
pub fn create(kind: Kind, heap: &Heap) -> index::Result<Idx> {
    let t: Idx = match kind {
        Kind::Hash | Kind::HashNoCache => {
            Arc::new(LfHash::create(heap, &hash_opts(kind == Kind::Hash))?)
        }
        Kind::Skip | Kind::SkipNoCache => {
            Arc::new(SkipList::create(heap, &skip_opts(kind == Kind::Skip))?)
        }
        Kind::PHash => Arc::new(PHash::create(heap, &phash_opts())?),
    };
    heap.set_root(t.root())?;
    Ok(t)
}

/// Attaches to the structure at the heap root and runs the index recovery (repair,
/// leak sweep); returns the heap, open for allocation.
pub fn recover(kind: Kind, rec: Recovery) -> index::Result<(Heap, Idx, RecoverStats)> {
    let root = rec.heap().root();
    match kind {
        Kind::Hash | Kind::HashNoCache => {
            let t = LfHash::attach(rec.heap(), root, &hash_opts(kind == Kind::Hash))?;
            let (heap, st) = index::recover(rec, &[&t])?;
            Ok((heap, Arc::new(t), st))
        }
        Kind::Skip | Kind::SkipNoCache => {
            let t = SkipList::attach(rec.heap(), root, &skip_opts(kind == Kind::Skip))?;
            let (heap, st) = index::recover(rec, &[&t])?;
            Ok((heap, Arc::new(t), st))
        }
        Kind::PHash => {
            let t = PHash::attach(rec.heap(), root)?;
            let (heap, st) = index::recover(rec, &[&t])?;
            Ok((heap, Arc::new(t), st))
        }
    }
}

/// Heap options of the tests: small geometry (1 MiB chunks, 4 thread slots), the
/// given persistence strategy, growth up to `max_size`.
pub fn heap_opts(size: u64, max_size: u64, strategy: Strategy) -> HeapOptions {
    HeapOptions {
        size,
        max_size,
        reserve: max_size.max(size),
        geometry: Geometry::small(),
        strategy,
        ..Default::default()
    }
}

/// Options for heaps driven by the crash simulator (no real flushes needed).
pub fn sim_opts() -> HeapOptions {
    heap_opts(2 << 20, 16 << 20, Strategy::FenceOnly)
}

/// A directory in memory when there is one (images are written often).
pub fn shm_dir() -> std::path::PathBuf {
    let d = std::path::Path::new("/dev/shm");
    if d.is_dir() {
        d.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// An environment knob with a default.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Writes a line to the process's stderr directly (the harness captures only the
/// print macros), so that summaries show in the test log.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

// ---- keys and values ----

/// Key number `i` (lengths vary a little).
pub fn key(i: usize) -> Vec<u8> {
    format!("key{i:03}{}", "#".repeat(i % 5 * 3)).into_bytes()
}

/// A key number in `0..nkeys`, half of the time one of the first four (hot keys:
/// concurrent operations on one key).
pub fn pick_key(rng: &mut SmallRng, nkeys: usize) -> usize {
    if rng.random_bool(0.5) {
        rng.random_range(0..4.min(nkeys))
    } else {
        rng.random_range(0..nkeys)
    }
}

/// splitmix64 finaliser.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A value id from (round, thread, op number): unique per written value.
pub fn vid(round: u64, tid: u64, n: u64) -> u64 {
    assert!(round < 1 << 20 && tid < 1 << 8 && n < 1 << 36);
    (round << 44) | (tid << 36) | n
}

/// Splits a value id into (round, thread, op number).
pub fn vid_parts(id: u64) -> (u64, u64, u64) {
    (id >> 44, (id >> 36) & 0xff, id & ((1 << 36) - 1))
}

fn filler_len(id: u64) -> usize {
    let h = mix(id ^ 0x5eed);
    if h.is_multiple_of(20) {
        300 + (h >> 8) as usize % 1500
    } else {
        (h >> 8) as usize % 120
    }
}

/// The value written with id `id`: `{id:016x}|` then filler derived from the id.
pub fn value(id: u64) -> Vec<u8> {
    let mut v = format!("{id:016x}|").into_bytes();
    let h = mix(id);
    for i in 0..filler_len(id) {
        v.push((h >> (8 * (i % 8))) as u8 ^ i as u8);
    }
    v
}

/// The id of a value, or why it is not one [`value`] wrote (torn, foreign).
pub fn value_id(v: &[u8]) -> Result<u64, String> {
    let bad = || format!("not a test value: {:?}", String::from_utf8_lossy(v));
    if v.len() < 17 || v[16] != b'|' {
        return Err(bad());
    }
    let id = std::str::from_utf8(&v[..16])
        .ok()
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .ok_or_else(bad)?;
    if value(id) != v {
        return Err(format!("value of id {id:#x} is torn or altered"));
    }
    Ok(id)
}

// ---- histories and the durable-linearizability check ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Get,
    Put,
    Insert,
    Remove,
}

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Get => "get",
            OpKind::Put => "put",
            OpKind::Insert => "insert",
            OpKind::Remove => "remove",
        }
    }
    pub fn parse(s: &str) -> Option<OpKind> {
        [OpKind::Get, OpKind::Put, OpKind::Insert, OpKind::Remove]
            .into_iter()
            .find(|k| k.name() == s)
    }
    /// A random operation: put 40%, insert 20%, remove 30%, get 10%.
    pub fn random(rng: &mut SmallRng) -> OpKind {
        match rng.random_range(0..10u32) {
            0..=3 => OpKind::Put,
            4..=5 => OpKind::Insert,
            6..=8 => OpKind::Remove,
            _ => OpKind::Get,
        }
    }
}

/// Runs one operation through a handle: the result is the `bool` the operation
/// returned; a get also returns the id of the value it found.
pub fn run_op(
    h: &mut dyn Ops,
    kind: OpKind,
    k: &[u8],
    val: u64,
    out: &mut Vec<u8>,
) -> Result<(bool, Option<u64>), String> {
    let r = match kind {
        OpKind::Get => h.get(k, out),
        OpKind::Put => h.put(k, &value(val)),
        OpKind::Insert => h.insert(k, &value(val)),
        OpKind::Remove => h.remove(k),
    }
    .map_err(|e| format!("{} failed: {e}", kind.name()))?;
    let got = if kind == OpKind::Get && r {
        Some(value_id(out)?)
    } else {
        None
    };
    Ok((r, got))
}

/// One operation of a history. `inv` is taken before the operation starts, `resp`
/// after it returned (and, in the durability tests, after `sync` returned).
#[derive(Clone, Debug)]
pub struct OpRec {
    pub tid: u64,
    pub n: u64,
    pub kind: OpKind,
    pub key: usize,
    /// The id of the value a put / insert writes.
    pub val: u64,
    pub inv: u64,
    pub resp: Option<u64>,
    pub result: Option<bool>,
    /// The id of the value a completed get returned.
    pub got: Option<u64>,
}

impl OpRec {
    /// What the operation leaves in its key if it takes effect: `Some(Some(v))` a
    /// value, `Some(None)` absence, `None` no change. For a completed operation the
    /// result decides; an operation in flight may have either effect.
    fn effect(&self) -> Option<Option<u64>> {
        match (self.kind, self.result) {
            (OpKind::Get, _) => None,
            (OpKind::Put, _) => Some(Some(self.val)),
            (OpKind::Insert, Some(false)) => None,
            (OpKind::Insert, _) => Some(Some(self.val)),
            (OpKind::Remove, Some(false)) => None,
            (OpKind::Remove, _) => Some(None),
        }
    }
}

impl std::fmt::Display for OpRec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "t{}#{} {} key{}",
            self.tid,
            self.n,
            self.kind.name(),
            self.key
        )?;
        if matches!(self.kind, OpKind::Put | OpKind::Insert) {
            write!(f, " val {:#x}", self.val)?;
        }
        write!(f, " [{}, ", self.inv)?;
        match self.resp {
            Some(r) => write!(f, "{r}]")?,
            None => write!(f, "-]")?,
        }
        if let Some(r) = self.result {
            write!(f, " -> {r}")?;
        }
        if let Some(g) = self.got {
            write!(f, " {g:#x}")?;
        }
        Ok(())
    }
}

/// Key → value id.
pub type State = BTreeMap<usize, u64>;

fn show(v: Option<u64>) -> String {
    match v {
        Some(v) => format!("{v:#x}"),
        None => "absent".into(),
    }
}

/// Durable linearizability of a recovered state, key by key (linearizability is
/// local, so checking every key's sub-history separately checks the whole).
///
/// `base` is the state before the history; `ops` the history; `cut` the instant of
/// the crash on the history's clock: an operation with `resp <= cut` had completed
/// (returned and synced) before the crash, one with `inv <= cut` and no earlier
/// response was in flight, one with `inv > cut` had not started. The recovered
/// state must be the result of a linearization of every completed operation (with
/// the results they returned, gets included) and any subset of the operations in
/// flight, respecting real-time order (Wing–Gong search over the per-thread
/// prefixes of each key's operations).
pub fn check_durable(
    base: &State,
    ops: &[OpRec],
    cut: u64,
    actual: &State,
    nkeys: usize,
) -> Result<(), String> {
    check_durable_with(base, ops, cut, actual, nkeys, false)
}

/// [`check_durable`], for histories with batches when `batched`: a completed
/// operation without a result (a batch's write) may have found the key present or
/// absent; a thread may have several operations on a key in flight, all of them
/// writes of the one batch in flight, of which any prefix may have taken effect.
pub fn check_durable_with(
    base: &State,
    ops: &[OpRec],
    cut: u64,
    actual: &State,
    nkeys: usize,
    batched: bool,
) -> Result<(), String> {
    if let Some(k) = actual.keys().find(|&&k| k >= nkeys) {
        return Err(format!("key{k} is outside the key space"));
    }
    let mut per_key: Vec<BTreeMap<u64, Vec<(&OpRec, bool)>>> = vec![BTreeMap::new(); nkeys];
    let mut sorted: Vec<&OpRec> = ops.iter().filter(|o| o.inv <= cut).collect();
    // Stable: a batch's writes keep their order.
    sorted.sort_by_key(|o| o.inv);
    for o in sorted {
        let done = o.resp.is_some_and(|r| r <= cut);
        per_key[o.key].entry(o.tid).or_default().push((o, done));
    }
    for (k, by_thread) in per_key.iter().enumerate() {
        let threads: Vec<Vec<(&OpRec, bool)>> = by_thread.values().cloned().collect();
        for t in &threads {
            let first = t.iter().position(|&(_, d)| !d).unwrap_or(t.len());
            let in_flight = &t[first..];
            let one_batch = in_flight
                .iter()
                .all(|&(o, d)| !d && o.inv == t[first].0.inv);
            if in_flight.len() > 1 && !(batched && one_batch) {
                return Err(format!(
                    "key{k}: a thread has operations in flight that are not one batch"
                ));
            }
        }
        let got = actual.get(&k).copied();
        if !linearizable_key(&threads, base.get(&k).copied(), got) {
            let mut msg = format!(
                "key{k}: recovered {} cannot be explained by its history (base {}; crash at {cut})\n\
                 operations on the key (done = completed before the crash; batch writes \
                 have no result):",
                show(got),
                show(base.get(&k).copied()),
            );
            let mut all: Vec<(&OpRec, bool)> = threads.iter().flatten().copied().collect();
            all.sort_by_key(|(o, _)| o.inv);
            for (o, d) in all {
                msg.push_str(&format!(
                    "\n  {o}{}",
                    if d { "  done" } else { "  in flight" }
                ));
            }
            if let Some(id) = got {
                match ops.iter().find(|o| o.val == id && o.kind != OpKind::Get) {
                    Some(o) => msg.push_str(&format!("\n  the recovered value was written by {o}")),
                    None if base.get(&k) == Some(&id) => {}
                    None => {
                        msg.push_str("\n  no operation of the history wrote the recovered value")
                    }
                }
            }
            return Err(msg);
        }
    }
    Ok(())
}

/// The value after operation `o` on `v`, or `None` if a completed operation's
/// result contradicts `v` (an operation in flight has no result to contradict,
/// nor does a batch's write, which reports none: it may have found either state).
fn step(o: &OpRec, done: bool, v: Option<u64>) -> Option<Option<u64>> {
    let ok = |r: bool| !done || o.result.is_none_or(|x| x == r);
    match o.kind {
        OpKind::Get => (ok(v.is_some()) && (!done || o.got == v)).then_some(v),
        OpKind::Put => ok(v.is_none()).then_some(Some(o.val)),
        OpKind::Insert => ok(v.is_none()).then_some(if v.is_none() { Some(o.val) } else { v }),
        OpKind::Remove => ok(v.is_some()).then_some(None),
    }
}

/// Whether one key's history (per thread, in program order, each op with whether it
/// completed) has a linearization that starts at `init`, contains every completed
/// operation and any of those in flight (each the last of its thread), and ends at
/// `want`.
pub fn linearizable_key(
    threads: &[Vec<(&OpRec, bool)>],
    init: Option<u64>,
    want: Option<u64>,
) -> bool {
    let n = threads.len();
    let mut stack = vec![(vec![0usize; n], init)];
    let mut seen = std::collections::HashSet::new();
    while let Some((c, v)) = stack.pop() {
        if !seen.insert((c.clone(), v)) {
            continue;
        }
        if v == want && (0..n).all(|i| threads[i][c[i]..].iter().all(|&(_, d)| !d)) {
            return true;
        }
        for i in 0..n {
            let Some(&(o, done)) = threads[i].get(c[i]) else {
                continue;
            };
            // Minimal: no other pending completed operation responded before o began.
            let blocked = (0..n).any(|j| {
                j != i
                    && threads[j]
                        .get(c[j])
                        .is_some_and(|&(p, pd)| pd && p.resp.unwrap() < o.inv)
            });
            if blocked {
                continue;
            }
            if let Some(v2) = step(o, done, v) {
                let mut c2 = c.clone();
                c2[i] += 1;
                stack.push((c2, v2));
            }
        }
    }
    false
}

/// The state after applying every completed operation of a sequential history.
pub fn apply_sequential(base: &State, ops: &[OpRec]) -> State {
    let mut s = base.clone();
    for o in ops {
        match o.effect() {
            Some(Some(v)) => {
                s.insert(o.key, v);
            }
            Some(None) => {
                s.remove(&o.key);
            }
            None => {}
        }
    }
    s
}

// ---- checks of a recovered structure ----

/// Structure and allocator checks: `verify(true)` passes, `check_heap` finds no
/// problem and no pending log, and the allocated blocks are exactly the structure's
/// blocks (no leak, no lost block).
pub fn check_recovered(t: &dyn DynIndex, heap: &Heap) -> Result<Verified, String> {
    let v = t.verify(true).map_err(|e| format!("verify: {e}"))?;
    let rep = pmem::check_heap(heap);
    if !rep.ok() {
        return Err(format!("check_heap:\n{rep}"));
    }
    if rep.pending_logs != 0 {
        return Err(format!(
            "{} committed logs pending\n{rep}",
            rep.pending_logs
        ));
    }
    if rep.blocks != v.blocks {
        return Err(format!(
            "{} blocks allocated but the structure owns {} (leak or lost block)\n{v:?}\n{rep}",
            rep.blocks, v.blocks
        ));
    }
    Ok(v)
}

/// Reads keys `0..nkeys` through a handle; checks that the structure holds no other
/// key (`verify().keys`).
pub fn read_state(t: &dyn DynIndex, nkeys: usize) -> Result<State, String> {
    read_keys(t, (0..nkeys).map(key))
}

/// [`read_state`] over the given keys (key index = position in `keys`).
pub fn read_keys(
    t: &dyn DynIndex,
    keys: impl IntoIterator<Item = Vec<u8>>,
) -> Result<State, String> {
    let mut h = t.handle().map_err(|e| format!("handle: {e}"))?;
    let mut out = Vec::new();
    let mut s = State::new();
    for (k, kb) in keys.into_iter().enumerate() {
        if h.get(&kb, &mut out).map_err(|e| format!("get: {e}"))? {
            s.insert(k, value_id(&out).map_err(|e| format!("key{k}: {e}"))?);
        }
    }
    drop(h);
    let v = t.verify(true).map_err(|e| format!("verify: {e}"))?;
    if v.keys != s.len() as u64 {
        return Err(format!(
            "verify counts {} keys, gets find {} of the key space",
            v.keys,
            s.len()
        ));
    }
    Ok(s)
}

/// Runs `n` random operations on keys `0..nkeys + 8` of a recovered structure,
/// single-threaded, each checked against a model that starts at `state`; then the
/// whole content and the allocator are checked again (fresh allocations did not
/// overlap anything live, nothing leaked). Value ids are `vid(round, 255, i)`.
pub fn exercise(
    t: &dyn DynIndex,
    heap: &Heap,
    state: &State,
    nkeys: usize,
    n: usize,
    round: u64,
    rng: &mut SmallRng,
) -> Result<(), String> {
    let mut model = state.clone();
    let all = nkeys + 8;
    {
        let mut h = t.handle().map_err(|e| format!("handle: {e}"))?;
        let mut out = Vec::new();
        for i in 0..n {
            let k = rng.random_range(0..all);
            let kind = OpKind::random(rng);
            let id = vid(round, 255, i as u64);
            let (r, got) = run_op(&mut *h, kind, &key(k), id, &mut out)
                .map_err(|e| format!("after recovery, op {i}: {e}"))?;
            let want = match kind {
                OpKind::Get => model.contains_key(&k),
                OpKind::Put => model.insert(k, id).is_none(),
                OpKind::Insert => {
                    if let std::collections::btree_map::Entry::Vacant(e) = model.entry(k) {
                        e.insert(id);
                        true
                    } else {
                        false
                    }
                }
                OpKind::Remove => model.remove(&k).is_some(),
            };
            if r != want || (kind == OpKind::Get && got != model.get(&k).copied()) {
                return Err(format!(
                    "after recovery, op {i} {} key{k}: returned {r} {got:?}, model says {want} {:?}",
                    kind.name(),
                    model.get(&k)
                ));
            }
        }
        h.sync().map_err(|e| format!("sync: {e}"))?;
    }
    check_model(
        t,
        heap,
        &model,
        all,
        "after operations on the recovered structure",
    )
}

/// The structure holds exactly `model` on keys `0..nkeys`, and its recovery checks
/// (allocator, leaks) pass; errors say `what`.
pub fn check_model(
    t: &dyn DynIndex,
    heap: &Heap,
    model: &State,
    nkeys: usize,
    what: &str,
) -> Result<(), String> {
    let s = read_state(t, nkeys).map_err(|e| format!("{what}: {e}"))?;
    if s != *model {
        return Err(format!("{what}: content {s:?}, model {model:?}"));
    }
    check_recovered(t, heap).map_err(|e| format!("{what}: {e}"))?;
    Ok(())
}

/// Everything [`check_recovered`] and [`read_state`] check, plus durable
/// linearizability against a history.
pub fn check_history(
    t: &dyn DynIndex,
    heap: &Heap,
    base: &State,
    ops: &[OpRec],
    cut: u64,
    nkeys: usize,
) -> Result<State, String> {
    check_recovered(t, heap)?;
    let s = read_state(t, nkeys)?;
    check_durable(base, ops, cut, &s, nkeys)?;
    Ok(s)
}
