//! `ember bench index`: throughput and latency of the index structures under the
//! log-free paper's workload.
//!
//! The structure is prefilled with `--size` distinct keys drawn at random from a
//! key range of `2 × size`. Then each of `--threads` threads, with its own handle
//! and its own random generator, runs operations for `--seconds`: with probability
//! `--update-ratio` an update, half of them inserts (insert-if-absent) and half
//! removes of a random key of the range, so the size stays around `--size`; the
//! rest are gets of a random key. Keys and values are 8 bytes by default, like the
//! paper's.
//!
//! Implementations (`--impl`):
//! - `logfree`: link-and-persist with the link cache (log-free paper §4). An update
//!   returns with its last link possibly still in the cache; the handle syncs
//!   every 64 operations (and an operation depending on a cached link flushes it),
//!   as in the paper's measurements: `durable_at` is `cache-flush`. With
//!   `--sync-every 1` every update is durable when it returns (`durable_at` `op`).
//! - `logfree-nocache`: link-and-persist only; every update is durable when it
//!   returns.
//! - `redo`: the lock-based baseline with a redo-log transaction per update
//!   (`phash`; hash table only).
//!
//! Latency: one operation in `SAMPLE_EVERY` (8) is timed, with clock readings
//! right before and right after it (key choice excluded); throughput counts every
//! operation. Reading the clock around every operation would add the same tens of
//! nanoseconds to every implementation's operations, a sizeable part of a
//! log-free update, and so shrink the ratios between them. `fences_per_op` and `flushes_per_op` are the heap's persistence
//! counters over the measured interval divided by the operations completed.

use super::{delta, si, BenchResult, Machine, TempHeap};

/// One operation in this many is timed (see the module note).
const SAMPLE_EVERY: u64 = 8;
use crate::util::human_bytes;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use index::any::AnyIndex;
use index::{HashOptions, Index, LfHash, Ops, PHash, PHashOptions};
use pmem::layout::MIB;
use pmem::{Geometry, Heap, HeapOptions, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Structure {
    /// The log-free hash table (or, with `--impl redo`, the lock-based phash).
    Hash,
    /// The log-free skip list.
    Skiplist,
}

impl Structure {
    pub fn name(self) -> &'static str {
        match self {
            Structure::Hash => "hash",
            Structure::Skiplist => "skiplist",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Impl {
    /// Link-and-persist with the link cache.
    Logfree,
    /// Link-and-persist without the link cache.
    LogfreeNocache,
    /// Lock-based, one redo-log transaction per update (hash table only: phash).
    Redo,
}

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Logfree => "logfree",
            Impl::LogfreeNocache => "logfree-nocache",
            Impl::Redo => "redo",
        }
    }
}

#[derive(Args, Debug)]
pub struct IndexArgs {
    /// Which structure.
    #[arg(long, value_enum, default_value = "hash")]
    pub structure: Structure,
    /// Which implementation: logfree (with the link cache), logfree-nocache, or
    /// redo (the lock-based redo-log baseline, phash; hash only).
    #[arg(long = "impl", value_enum, default_value = "logfree")]
    pub imp: Impl,
    /// Worker threads (each with its own handle).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Keys prefilled (drawn from a key range of 2 × size).
    #[arg(long, default_value_t = 1024)]
    pub size: u64,
    /// Fraction of operations that are updates (half inserts, half removes); the
    /// rest are gets. 1.0 = updates only.
    #[arg(long, default_value_t = 1.0)]
    pub update_ratio: f64,
    /// Emulated extra latency per fence, in ns.
    #[arg(long, default_value_t = 0)]
    pub fence_ns: u64,
    /// Emulated extra latency per node read while searching, in ns (the
    /// papers' "persistent memory reads are slower than DRAM" setting).
    #[arg(long, default_value_t = 0)]
    pub read_ns: u64,
    /// Measured run time in seconds (fractions allowed).
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Key size in bytes (at least 8: the key number, big-endian, then zeros).
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 8)]
    pub value_size: usize,
    /// Call sync() on the handle every N operations (0 = rely on the structure's
    /// own batching; only changes anything with the link cache).
    #[arg(long, default_value_t = 0)]
    pub sync_every: u64,
    /// Buckets of the hash tables (0 = the size rounded up to a power of two).
    #[arg(long, default_value_t = 0)]
    pub buckets: u64,
    /// Persistence strategy: auto, clwb, clflushopt, clflush, fence-only or msync.
    #[arg(long, default_value = "auto")]
    pub strategy: String,
    /// Directory for the temporary heap file (default: the system temp dir).
    /// The file is removed at the end, also when the bench is stopped by SIGINT,
    /// SIGTERM or SIGHUP or panics; a SIGKILL leaves ember-bench-*.heap.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Seed of the random generators (thread i uses seed + i + 1).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also walk the structure after the run and check its invariants.
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// Keys of the workload: number `k` as `key_size` bytes (big-endian first, so the
/// skip list's byte order is numeric order).
#[inline]
pub fn encode_key(k: u64, buf: &mut [u8]) {
    buf[..8].copy_from_slice(&k.to_be_bytes());
}

/// Heap size for `size` keys of the given sizes (generous: blocks are rounded to
/// size classes, removed blocks wait for their epoch, the skip list has towers).
pub fn heap_bytes_for(size: u64, key_size: usize, value_size: usize, buckets: u64) -> u64 {
    let per_key = 2 * (96 + key_size as u64 + value_size as u64).next_multiple_of(16);
    size.saturating_mul(2)
        .saturating_mul(per_key)
        .saturating_add(buckets.saturating_mul(32))
        .saturating_add(64 * MIB)
        .next_multiple_of(MIB)
        .max(128 * MIB)
}

/// Creates the structure `structure`/`imp` in `heap` and makes it the heap root.
pub fn create(heap: &Heap, structure: Structure, imp: Impl, buckets: u64) -> BenchResult<AnyIndex> {
    let t: AnyIndex = match (structure, imp) {
        (Structure::Hash, Impl::Redo) => PHash::create(
            heap,
            &PHashOptions {
                buckets,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?
        .into(),
        (Structure::Hash, _) => LfHash::create(
            heap,
            &HashOptions {
                initial_buckets: buckets,
                link_cache: imp == Impl::Logfree,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?
        .into(),
        (Structure::Skiplist, Impl::Redo) => return Err(no_skip_redo()),
        (Structure::Skiplist, _) => create_skip(heap, imp == Impl::Logfree)?,
    };
    heap.set_root(t.root()).map_err(|e| e.to_string())?;
    Ok(t)
}

fn create_skip(heap: &Heap, link_cache: bool) -> BenchResult<AnyIndex> {
    let opts = index::SkipOptions {
        link_cache,
        ..Default::default()
    };
    Ok(index::SkipList::create(heap, &opts)
        .map_err(|e| e.to_string())?
        .into())
}

fn no_skip_redo() -> String {
    "--structure skiplist --impl redo: the redo-log baseline exists for the hash table \
     only (phash: lock-based buckets, one redo-log transaction per update); there is \
     no lock-based skip list to compare against. Use --structure hash --impl redo."
        .into()
}

/// Fills `t` with `size` distinct random keys of `[0, 2 × size)` using `threads`
/// threads (thread `i` draws keys `≡ i mod threads`). Every handle syncs before
/// it is dropped.
pub fn prefill(
    t: &AnyIndex,
    size: u64,
    threads: usize,
    key_size: usize,
    value_size: usize,
    seed: u64,
) -> BenchResult<()> {
    let threads = threads.max(1) as u64;
    let range = size.saturating_mul(2).max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                s.spawn(move || -> BenchResult<()> {
                    let quota = size / threads + u64::from(i < size % threads);
                    let class = (range - i).div_ceil(threads);
                    let mut h = t.handle().map_err(|e| e.to_string())?;
                    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_f111 ^ (i << 32));
                    let mut key = vec![0u8; key_size];
                    let mut val = vec![0u8; value_size];
                    let mut n = 0;
                    while n < quota {
                        let k = rng.random_range(0..class) * threads + i;
                        encode_key(k, &mut key);
                        let m = value_size.min(8);
                        val[..m].copy_from_slice(&k.to_le_bytes()[..m]);
                        if h.insert(&key, &val).map_err(|e| e.to_string())? {
                            n += 1;
                        }
                    }
                    h.sync().map_err(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("prefill thread panicked".into()))
            })
            .collect::<BenchResult<Vec<()>>>()
    })?;
    Ok(())
}

/// What one worker did.
struct Worker {
    hist: Histogram<u64>,
    ops: u64,
    elapsed: Duration,
    inserts: u64,
    inserted: u64,
    removes: u64,
    removed: u64,
    gets: u64,
    found: u64,
}

pub fn run(args: &IndexArgs) -> BenchResult<()> {
    if args.threads == 0 || args.threads > 512 {
        return Err(format!("--threads {} must be in 1..=512", args.threads));
    }
    if args.size == 0 || args.size > 1 << 34 {
        return Err(format!("--size {} must be in 1..=2^34", args.size));
    }
    if !(0.0..=1.0).contains(&args.update_ratio) {
        return Err(format!(
            "--update-ratio {} must be in [0, 1]",
            args.update_ratio
        ));
    }
    if !(args.seconds > 0.0 && args.seconds <= 3600.0) {
        return Err(format!("--seconds {} must be in (0, 3600]", args.seconds));
    }
    if args.key_size < 8 || args.key_size > index::MAX_KEY {
        return Err(format!(
            "--key-size {} must be in 8..={}",
            args.key_size,
            index::MAX_KEY
        ));
    }
    if args.value_size > 1 << 20 {
        return Err(format!(
            "--value-size {} must be at most 1 MiB",
            args.value_size
        ));
    }
    if args.structure == Structure::Skiplist && args.imp == Impl::Redo {
        return Err(no_skip_redo());
    }
    let strategy = Strategy::parse(&args.strategy).map_err(|e| e.to_string())?;
    let machine = Machine::detect();
    let buckets = if args.buckets == 0 {
        args.size.next_power_of_two()
    } else {
        args.buckets
    };
    let size = heap_bytes_for(args.size, args.key_size, args.value_size, buckets);
    let opts = HeapOptions {
        size,
        max_size: size.saturating_mul(4),
        strategy,
        fence_ns: args.fence_ns,
        read_ns: args.read_ns,
        geometry: Geometry {
            nslots: (args.threads as u64 + 2).max(Geometry::default().nslots),
            ..Geometry::default()
        },
        ..Default::default()
    };
    let path = args.dir.as_ref().map(|d| {
        d.join(format!(
            "ember-bench-index-{}-{}.heap",
            std::process::id(),
            args.structure.name()
        ))
    });
    let tmp = TempHeap::create(path.as_deref(), "-index", &opts)?;
    let heap = &tmp.heap;
    let heap_path = tmp.path().display().to_string();
    let t = create(heap, args.structure, args.imp, buckets)?;
    let name = t.name();
    let t_fill = Instant::now();
    prefill(
        &t,
        args.size,
        args.threads.min(Machine::detect().cores).max(1),
        args.key_size,
        args.value_size,
        args.seed,
    )?;
    let fill_s = t_fill.elapsed().as_secs_f64();
    let keys_before = t.len_estimate();

    let region = heap.region();
    let n = args.threads;
    let ready = Barrier::new(n + 1);
    let go = Barrier::new(n + 1);
    let done = Barrier::new(n + 1);
    let run_for = Duration::from_secs_f64(args.seconds);
    let (s0, s1, results) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let (t, ready, go, done) = (&t, &ready, &go, &done);
                s.spawn(move || {
                    let r = worker(t, args, i as u64, ready, go, run_for);
                    done.wait();
                    r
                })
            })
            .collect();
        ready.wait();
        let s0 = region.persist_stats();
        go.wait();
        done.wait();
        let s1 = region.persist_stats();
        let results: Vec<BenchResult<Worker>> = super::join_all(hs);
        (s0, s1, results)
    });
    let mut ws = Vec::with_capacity(n);
    for r in results {
        ws.push(r?);
    }
    let d = delta(s0, s1);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds");
    let (mut ops, mut rate) = (0u64, 0.0);
    let (mut ins, mut insd, mut rem, mut remd, mut gets, mut found) = (0, 0, 0, 0, 0, 0);
    let mut elapsed_max = Duration::ZERO;
    for w in &ws {
        hist.add(&w.hist).map_err(|e| format!("histogram: {e:?}"))?;
        ops += w.ops;
        rate += w.ops as f64 / w.elapsed.as_secs_f64().max(1e-9);
        elapsed_max = elapsed_max.max(w.elapsed);
        ins += w.inserts;
        insd += w.inserted;
        rem += w.removes;
        remd += w.removed;
        gets += w.gets;
        found += w.found;
    }
    let opsf = ops.max(1) as f64;
    let fences_per_op = d.fences as f64 / opsf;
    let flushes_per_op = d.flushes as f64 / opsf;
    let keys_after = t.len_estimate();
    let verified = if args.verify {
        Some(t.verify(true)?)
    } else {
        None
    };
    t.close().map_err(|e| e.to_string())?;
    let durable_at = match (args.imp, args.sync_every) {
        (Impl::Logfree, 1) => "op",
        (Impl::Logfree, _) => "cache-flush",
        _ => "op",
    };
    let q = |x: f64| hist.value_at_quantile(x);

    if args.json {
        let mut v = json!({
            "bench": "index",
            "machine": machine.to_json(),
            "strategy": strategy.name(),
            "fence_ns": args.fence_ns,
            "read_ns": args.read_ns,
            "threads": n,
            "size": args.size,
            "key_range": args.size.saturating_mul(2),
            "update_ratio": args.update_ratio,
            "structure": args.structure.name(),
            "impl": args.imp.name(),
            "implementation": name,
            "key_size": args.key_size,
            "value_size": args.value_size,
            "buckets": if matches!(args.structure, Structure::Hash) { Some(buckets) } else { None },
            "sync_every": args.sync_every,
            "durable_at": durable_at,
        });
        let more = json!({
            "seconds": args.seconds,
            "elapsed_s": elapsed_max.as_secs_f64(),
            "prefill_s": fill_s,
            "ops": ops,
            "ops_per_sec": rate,
            "ops_per_sec_per_thread": rate / n as f64,
            "p50_ns": q(0.5),
            "p90_ns": q(0.9),
            "p99_ns": q(0.99),
            "p999_ns": q(0.999),
            "max_ns": hist.max(),
            "mean_ns": hist.mean(),
            "fences_per_op": fences_per_op,
            "flushes_per_op": flushes_per_op,
            "msyncs_per_op": d.msyncs as f64 / opsf,
            "inserts": ins,
            "inserts_new": insd,
            "removes": rem,
            "removes_found": remd,
            "gets": gets,
            "gets_found": found,
            "keys_before": keys_before,
            "keys_after": keys_after,
            "heap": heap_path,
            "heap_size": heap.region().size(),
            "latency_definition": "per sampled operation (one in 8): clock read right before and right after it (key choice excluded)",
            "ops_per_sec_definition": "sum over threads of the thread's ops / its elapsed time",
        });
        if let (Some(a), Value::Object(b)) = (v.as_object_mut(), more) {
            a.extend(b);
        }
        if let Some(vf) = &verified {
            v["verified_keys"] = json!(vf.keys);
            v["verified_blocks"] = json!(vf.blocks);
        }
        println!("{v}");
    } else {
        println!(
            "ember bench index: {} {} ({name}), {} thread{}, {} keys (range {}), update ratio {}, \
             {}-byte keys, {}-byte values",
            args.structure.name(),
            args.imp.name(),
            n,
            if n == 1 { "" } else { "s" },
            args.size,
            args.size.saturating_mul(2),
            args.update_ratio,
            args.key_size,
            args.value_size
        );
        println!("machine:  {}", machine.line());
        println!(
            "strategy: {}   fence_ns: {}   read_ns: {}   durable at: {}   heap: {} ({})",
            strategy.name(),
            args.fence_ns,
            args.read_ns,
            durable_at,
            heap_path,
            human_bytes(heap.region().size())
        );
        println!(
            "{}ops/s ({}ops/s/thread) over {:.2} s; latency p50 {} ns, p99 {} ns, max {} ns; \
             {:.3} fences/op, {:.3} flushes/op; keys {} -> {}",
            si(rate),
            si(rate / n as f64),
            elapsed_max.as_secs_f64(),
            q(0.5),
            q(0.99),
            hist.max(),
            fences_per_op,
            flushes_per_op,
            keys_before,
            keys_after
        );
        if let Some(vf) = &verified {
            println!("verified: {} keys, {} blocks", vf.keys, vf.blocks);
        }
    }
    drop(t);
    drop(tmp);
    Ok(())
}

/// One measured thread. Always passes the `ready` and `go` barriers.
fn worker(
    t: &AnyIndex,
    args: &IndexArgs,
    i: u64,
    ready: &Barrier,
    go: &Barrier,
    run_for: Duration,
) -> BenchResult<Worker> {
    let h = t.handle().map_err(|e| e.to_string());
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds");
    let mut rng = SmallRng::seed_from_u64(args.seed.wrapping_add(i + 1));
    let range = args.size.saturating_mul(2);
    let mut key = vec![0u8; args.key_size];
    let mut val = vec![0u8; args.value_size];
    let mut out = Vec::with_capacity(args.value_size);
    let mut w = Worker {
        hist: Histogram::new_with_bounds(1, 2, 1).expect("bounds"),
        ops: 0,
        elapsed: Duration::ZERO,
        inserts: 0,
        inserted: 0,
        removes: 0,
        removed: 0,
        gets: 0,
        found: 0,
    };
    ready.wait();
    go.wait();
    let mut h = h?;
    let err = |e: index::Error| e.to_string();
    let start = Instant::now();
    let deadline = start + run_for;
    let all_updates = args.update_ratio >= 1.0;
    let no_updates = args.update_ratio <= 0.0;
    loop {
        let k = rng.random_range(0..range);
        encode_key(k, &mut key);
        let update = all_updates || (!no_updates && rng.random_bool(args.update_ratio));
        let timed = w.ops.is_multiple_of(SAMPLE_EVERY);
        let t0 = timed.then(Instant::now);
        if update {
            if rng.random_bool(0.5) {
                let m = args.value_size.min(8);
                val[..m].copy_from_slice(&w.ops.to_le_bytes()[..m]);
                w.inserts += 1;
                w.inserted += h.insert(&key, &val).map_err(err)? as u64;
            } else {
                w.removes += 1;
                w.removed += h.remove(&key).map_err(err)? as u64;
            }
        } else {
            w.gets += 1;
            w.found += h.get(&key, &mut out).map_err(err)? as u64;
        }
        w.ops += 1;
        if args.sync_every != 0 && w.ops.is_multiple_of(args.sync_every) {
            h.sync().map_err(err)?;
        }
        if let Some(t0) = t0 {
            let now = Instant::now();
            hist.saturating_record((now - t0).as_nanos().max(1) as u64);
            if now >= deadline {
                break;
            }
        }
    }
    // Whatever is still in the link cache becomes durable: part of the work.
    h.sync().map_err(err)?;
    w.elapsed = start.elapsed();
    w.hist = hist;
    Ok(w)
}
