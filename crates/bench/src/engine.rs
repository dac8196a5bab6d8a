//! `ember bench engine`: an in-process load on one of the engine's stores, after
//! Bullet's evaluation (ATC '18, §7): YCSB-style gets and puts on a scrambled
//! zipfian key choice.
//!
//! Stores (`--engine`): `volatile` (the DRAM table alone), `direct` (one tier on
//! the persistent heap, `--backend logfree|phash`), and Bullet: `bullet` (=
//! `bullet-full`), `bullet-st`, `bullet-lfr`, `bullet-opt`, `bullet-dyn`,
//! `bullet-full`.
//!
//! Threads: the static Bullet variants (`st`, `lfr`, `opt`) run the paper's static
//! split of `--threads`: `max(1, threads / 2)` gleaner threads owned by the store
//! and the rest (at least one) as workers. Every other store runs `--threads`
//! workers; with the dynamic variants (`dyn`, `full`) each worker calls
//! `maintain()` before every operation, and a call that gleaned (the worker served
//! as a gleaner) is neither counted as an operation nor timed.
//!
//! Workload: every key `0..keys` is put once before the clock starts (spread over
//! the workers; then Bullet's logs are drained and the volatile table's resize is
//! waited for). Keys are exactly `--key-size` bytes, `k` followed by the zero-padded
//! decimal key number. Each operation is a put with probability `--put-ratio` (a
//! fraction), else a get. The key number comes from YCSB's scrambled zipfian
//! generator: Gray et al.'s zipfian over `keys` items (zeta computed once, the
//! closed-form inverse), whose item is hashed with FNV-1a 64 and taken modulo
//! `keys` (YCSB draws from 10^10 items before the modulo; here the zipfian is over
//! the key count itself, so item 0 is exactly the hottest key). `--zipf 0` is
//! uniform.
//!
//! Measurement: `--warmup` seconds unrecorded, then `--seconds` measured. Each
//! worker reads the clock right before and right after each operation and records
//! the difference in its get or put histogram (merged at the end). `ops_per_sec` is
//! the operations begun in the measured interval divided by its length.
//! `gleaners_avg` is the store's gleaner count sampled every 10 ms. The store and
//! persistence counters (records, waits, fences, flushes) are differences over the
//! measured interval (the end snapshot is taken when every worker has stopped).
//!
//! Figure 7 mode: `--trace-steps 2,15,2,0,2,50,2` (put percentages) runs each step
//! for `--step-seconds` and prints one row per second (t, put percentage,
//! operations per second in that second, gleaners at its end, log occupancy).
//!
//! Backlog mode (Bullet's gleaning cost): `--backlog N --threads 1` with a
//! dynamic variant puts N records after the prefill while no thread takes the
//! gleaner role (one session, no role threads), then times the drain that applies them: wall
//! time, process CPU time, records applied and collapsed. With a long
//! `--epoch-ms` one thread drains; otherwise the advancer's idle gleaning
//! joins in after an epoch.

use super::{delta, si, BenchResult, Machine, TempHeap};
use crate::util::human_bytes;
use clap::Args;
use engine::bullet::{BulletOptions, BulletStore, Variant};
use engine::direct::{BackendKind, BackendOptions, DirectStore};
use engine::volatile::VolatileStore;
use engine::{Durability, Op, Session, Store, StoreStats};
use hdrhistogram::Histogram;
use pmem::layout::MIB;
use pmem::{Geometry, Heap, HeapOptions, PersistStats, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Which store to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Volatile,
    Direct,
    Bullet(Variant),
}

impl EngineKind {
    fn parse(s: &str) -> Result<EngineKind, String> {
        match s {
            "volatile" => Ok(EngineKind::Volatile),
            "direct" => Ok(EngineKind::Direct),
            "bullet" => Ok(EngineKind::Bullet(Variant::Full)),
            _ => match s.strip_prefix("bullet-") {
                Some(v) if !v.starts_with('+') => Variant::parse(v)
                    .map(EngineKind::Bullet)
                    .map_err(|e| e.to_string()),
                _ => Err(format!(
                    "unknown engine {s:?} (volatile, direct, bullet, bullet-st, bullet-lfr, \
                     bullet-opt, bullet-dyn or bullet-full)"
                )),
            },
        }
    }
}

fn parse_backend(s: &str) -> Result<BackendKind, String> {
    BackendKind::parse(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub struct EngineArgs {
    /// Store: volatile, direct, bullet (= bullet-full), bullet-st, bullet-lfr,
    /// bullet-opt, bullet-dyn or bullet-full.
    #[arg(long, value_parser = EngineKind::parse, default_value = "bullet")]
    pub engine: EngineKind,
    /// Backend index of direct and Bullet: logfree or phash.
    #[arg(long, value_parser = parse_backend, default_value = "logfree")]
    pub backend: BackendKind,
    /// Threads: all workers, except with the static Bullet variants (st, lfr, opt),
    /// where max(1, threads/2) are the store's gleaners and the rest workers.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Keys, all put once before the measurement.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Key size in bytes ("k" and the zero-padded key number).
    #[arg(long, default_value_t = 16)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Fraction of operations that are puts (0..=1; the rest are gets).
    #[arg(long, default_value_t = 0.5)]
    pub put_ratio: f64,
    /// Zipfian constant of the scrambled zipfian key choice (0 = uniform; < 1).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Measured run time in seconds (fractions allowed).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Unmeasured run time before the measurement, in seconds.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Emulated extra latency per fence, in ns.
    #[arg(long, default_value_t = 0)]
    pub fence_ns: u64,
    /// Emulated extra latency per node the heap's index structures read while
    /// searching (the backend of direct and Bullet), in ns: the papers'
    /// "persistent memory reads are slower than DRAM" setting. The DRAM frontend
    /// and the volatile store do not pay it.
    #[arg(long, default_value_t = 0)]
    pub read_ns: u64,
    /// Bullet: logs in the pool.
    #[arg(long, default_value_t = 32)]
    pub logs: usize,
    /// Bullet: size of each log, in MiB.
    #[arg(long, default_value_t = 64)]
    pub log_size: u64,
    /// Bullet: epoch length, in ms.
    #[arg(long, default_value_t = 10)]
    pub epoch_ms: u64,
    /// Initial buckets of the tables (0 = the key count rounded up to a power of two).
    #[arg(long, default_value_t = 0)]
    pub buckets: u64,
    /// Heap file (must not exist). Default: ember-bench-PID-engine.heap in the
    /// temp dir. Removed at the end, also when the bench is stopped by SIGINT,
    /// SIGTERM or SIGHUP or panics; a SIGKILL leaves it.
    #[arg(long)]
    pub heap: Option<PathBuf>,
    /// Heap size in MiB (0 = enough for the keys and the logs).
    #[arg(long, default_value_t = 0)]
    pub heap_size: u64,
    /// Persistence strategy: auto, clwb, clflushopt, clflush, fence-only or msync.
    #[arg(long, default_value = "auto")]
    pub strategy: String,
    /// Seed of the random generators (worker i uses seed + i + 1).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Figure 7 mode: put percentages run one after the other (e.g. 2,15,2,0,2,50,2),
    /// each for --step-seconds; one row per second. Replaces --put-ratio and
    /// --seconds.
    #[arg(long, value_delimiter = ',')]
    pub trace_steps: Vec<f64>,
    /// Figure 7 mode: seconds per step.
    #[arg(long, default_value_t = 5.0)]
    pub step_seconds: f64,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// (for `bench scenario`) With --json, also print the latency distributions:
    /// `get_cdf`, `put_cdf` and `all_cdf` as [quantile, ns] pairs at N evenly
    /// spaced quantiles plus the tail (0.9 to 0.9999), and `all_p99_ns`.
    #[arg(long, hide = true, default_value_t = 0)]
    pub cdf_points: usize,
    /// Bullet only: after the run, close the store without draining its logs,
    /// reopen the heap and time the recovery (§5: logs replayed into the
    /// frontend); printed as a second line (a second JSON object with --json).
    #[arg(long)]
    pub recovery: bool,
    /// Bullet's gleaning cost (dynamic variants, one thread): after the
    /// prefill, N puts (key choice as --zipf) are written while no thread
    /// takes the gleaner role, then the logs are drained and the drain timed (wall and
    /// process CPU): the backlog a burst of writes leaves for the gleaners.
    /// Replaces the timed get/put run. `applied_before_drain` counts what was
    /// gleaned during the puts anyway: the advancer sees a session's
    /// operations 256 at a time, so puts slower than 256 an epoch (one
    /// `msync` each under --strategy msync) look idle to it and it drains
    /// them; a long --epoch-ms keeps it out.
    #[arg(long, default_value_t = 0)]
    pub backlog: u64,
}

// ---------------------------------------------------------------------------
// Key choice

/// FNV-1a 64 of the 8 little-endian bytes of `v`, made non-negative as YCSB's
/// `Utils.fnvhash64` does (`Math.abs` of the signed value).
#[inline]
pub fn fnv1a64(v: u64) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for b in v.to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(PRIME);
    }
    (h as i64).wrapping_abs() as u64
}

/// `sum_{i=1..=n} 1 / i^theta`.
fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

/// The zipfian generator of Gray et al. ("Quickly generating billion-record
/// synthetic databases", SIGMOD '94) as YCSB's `ZipfianGenerator` has it: items
/// `0..items`, item 0 the most popular.
#[derive(Clone, Copy, Debug)]
pub struct Zipfian {
    items: u64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    half_pow_theta: f64,
}

impl Zipfian {
    /// `items >= 1`, `0 < theta < 1`. Computes zeta(items, theta) (O(items)).
    pub fn new(items: u64, theta: f64) -> Zipfian {
        assert!(items >= 1 && theta > 0.0 && theta < 1.0);
        let zeta2 = zeta(2, theta);
        let zetan = zeta(items, theta);
        Zipfian {
            items,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
            half_pow_theta: 0.5f64.powf(theta),
        }
    }

    /// The item for a uniform `u` in `[0, 1)`.
    #[inline]
    pub fn item(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + self.half_pow_theta {
            return 1.min(self.items - 1);
        }
        let r = self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha);
        // `as` saturates; the clamp covers rounding at the top.
        (r as u64).min(self.items - 1)
    }
}

/// How the workers choose key numbers.
#[derive(Clone, Copy, Debug)]
pub enum KeyChooser {
    Uniform {
        keys: u64,
    },
    /// YCSB's `ScrambledZipfianGenerator`: a zipfian item, hashed, modulo the keys.
    Scrambled {
        zipf: Zipfian,
        keys: u64,
    },
}

impl KeyChooser {
    /// `theta == 0`: uniform.
    pub fn new(keys: u64, theta: f64) -> KeyChooser {
        if theta == 0.0 {
            KeyChooser::Uniform { keys }
        } else {
            KeyChooser::Scrambled {
                zipf: Zipfian::new(keys, theta),
                keys,
            }
        }
    }

    #[inline]
    pub fn next(&self, rng: &mut SmallRng) -> u64 {
        match self {
            KeyChooser::Uniform { keys } => rng.random_range(0..*keys),
            KeyChooser::Scrambled { zipf, keys } => fnv1a64(zipf.item(rng.random::<f64>())) % keys,
        }
    }
}

/// Writes key number `k` as `k` followed by the zero-padded decimal number, filling
/// `buf` exactly (the caller checked that the digits fit).
#[inline]
fn encode_key(mut k: u64, buf: &mut [u8]) {
    buf[0] = b'k';
    for b in buf[1..].iter_mut().rev() {
        *b = b'0' + (k % 10) as u8;
        k /= 10;
    }
    debug_assert_eq!(k, 0);
}

fn decimal_digits(mut n: u64) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

// ---------------------------------------------------------------------------
// The run

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// How long the main thread waits for the workers after the end before it gives up
/// (a store that hangs).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

#[repr(align(128))]
struct PaddedCounter(AtomicU64);

/// What the main thread and the workers share.
struct Control {
    phase: AtomicU8,
    /// The current put ratio (f64 bits).
    put_ratio: AtomicU64,
    /// Per worker: operations begun in the measured interval.
    ops: Box<[PaddedCounter]>,
    /// Workers that returned (error or not; counted after the session dropped).
    finished: AtomicUsize,
}

/// Counts a worker as finished when it goes, whatever the way.
struct Finish<'a>(&'a AtomicUsize);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// What every thread of the run needs to know.
struct Params {
    keys: u64,
    key_size: usize,
    value_size: usize,
    seed: u64,
    dynamic: bool,
    chooser: KeyChooser,
}

fn new_hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds")
}

/// What one worker did in the measured interval.
struct WorkerOut {
    get_hist: Histogram<u64>,
    put_hist: Histogram<u64>,
    gets: u64,
    puts: u64,
    get_misses: u64,
    /// `maintain()` calls that gleaned.
    gleans: u64,
}

/// One row of the figure 7 trace.
struct Row {
    t: f64,
    put_pct: f64,
    ops_per_sec: f64,
    gleaners: u64,
    log_occupancy: f64,
}

/// Everything measured.
struct Measured {
    workers: Vec<WorkerOut>,
    elapsed: Duration,
    gleaners_avg: f64,
    gleaner_samples: u64,
    stats0: StoreStats,
    stats1: StoreStats,
    persist: Option<PersistStats>,
    trace: Vec<Row>,
    prefill_s: f64,
    settle_s: f64,
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Puts every key once, key `k` by worker `k mod threads`.
fn prefill<S: Store>(store: &S, p: &Params, threads: usize) -> BenchResult<()> {
    let threads = threads.max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                s.spawn(move || -> BenchResult<()> {
                    let mut sess = store.session().map_err(err)?;
                    let mut key = vec![0u8; p.key_size];
                    let mut val = vec![b'v'; p.value_size];
                    for k in (i as u64..p.keys).step_by(threads) {
                        if p.dynamic {
                            sess.maintain().map_err(err)?;
                        }
                        encode_key(k, &mut key);
                        let m = val.len().min(8);
                        val[..m].copy_from_slice(&k.to_le_bytes()[..m]);
                        sess.apply(&key, Op::Put(&val)).map_err(err)?;
                    }
                    Ok(())
                })
            })
            .collect();
        super::join_all(hs)
            .into_iter()
            .collect::<BenchResult<Vec<()>>>()
    })?;
    Ok(())
}

/// One measured thread. Always passes the `ready` barrier.
fn worker<S: Store>(
    store: &S,
    w: usize,
    p: &Params,
    ctl: &Control,
    ready: &Barrier,
) -> BenchResult<WorkerOut> {
    // Declared first, dropped last: after the session.
    let _finish = Finish(&ctl.finished);
    let sess = store.session().map_err(err);
    ready.wait();
    let mut sess = sess?;
    let mut rng = SmallRng::seed_from_u64(p.seed.wrapping_add(w as u64 + 1));
    let mut key = vec![0u8; p.key_size];
    let mut val = vec![b'v'; p.value_size];
    let mut out = Vec::with_capacity(p.value_size);
    let mut o = WorkerOut {
        get_hist: new_hist(),
        put_hist: new_hist(),
        gets: 0,
        puts: 0,
        get_misses: 0,
        gleans: 0,
    };
    let mut seq = (w as u64) << 48;
    let mut measured = 0u64;
    loop {
        let phase = ctl.phase.load(Ordering::Relaxed);
        if phase == STOP {
            break;
        }
        if p.dynamic && sess.maintain().map_err(err)? {
            if phase == MEASURE {
                o.gleans += 1;
            }
            continue;
        }
        let k = p.chooser.next(&mut rng);
        encode_key(k, &mut key);
        let ratio = f64::from_bits(ctl.put_ratio.load(Ordering::Relaxed));
        let put = ratio > 0.0 && rng.random::<f64>() < ratio;
        let ns = if put {
            seq = seq.wrapping_add(1);
            let m = val.len().min(8);
            val[..m].copy_from_slice(&seq.to_le_bytes()[..m]);
            let t0 = Instant::now();
            sess.apply(&key, Op::Put(&val)).map_err(err)?;
            t0.elapsed()
        } else {
            let t0 = Instant::now();
            let found = sess.get(&key, &mut out).map_err(err)?;
            let ns = t0.elapsed();
            if !found && phase == MEASURE {
                o.get_misses += 1;
            }
            ns
        };
        if phase == MEASURE {
            let ns = (ns.as_nanos() as u64).max(1);
            if put {
                o.puts += 1;
                o.put_hist.saturating_record(ns);
            } else {
                o.gets += 1;
                o.get_hist.saturating_record(ns);
            }
            measured += 1;
            ctl.ops[w].0.store(measured, Ordering::Relaxed);
        }
    }
    drop(sess);
    Ok(o)
}

/// Prefills, settles (`settle`: Bullet's drain, the volatile table's resize), runs
/// the workers and measures.
fn measure<S: Store>(
    store: &S,
    args: &EngineArgs,
    p: &Params,
    workers: usize,
    region: Option<&pmem::Region>,
    settle: impl FnOnce() -> BenchResult<()>,
) -> BenchResult<Measured> {
    let t = Instant::now();
    prefill(store, p, workers)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    settle()?;
    let settle_s = t.elapsed().as_secs_f64();

    let trace_mode = !args.trace_steps.is_empty();
    let first_ratio = if trace_mode {
        args.trace_steps[0] / 100.0
    } else {
        args.put_ratio
    };
    let total = if trace_mode {
        Duration::from_secs_f64(args.step_seconds * args.trace_steps.len() as f64)
    } else {
        Duration::from_secs_f64(args.seconds)
    };
    let ctl = Control {
        phase: AtomicU8::new(WARMUP),
        put_ratio: AtomicU64::new(first_ratio.to_bits()),
        ops: (0..workers)
            .map(|_| PaddedCounter(AtomicU64::new(0)))
            .collect(),
        finished: AtomicUsize::new(0),
    };
    let ready = Barrier::new(workers + 1);
    let sum_ops =
        |ctl: &Control| -> u64 { ctl.ops.iter().map(|c| c.0.load(Ordering::Relaxed)).sum() };

    std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers)
            .map(|w| {
                let (ctl, ready) = (&ctl, &ready);
                s.spawn(move || worker(store, w, p, ctl, ready))
            })
            .collect();
        ready.wait();
        std::thread::sleep(Duration::from_secs_f64(args.warmup));
        let p0 = region.map(|r| r.persist_stats());
        let stats0 = store.stats();
        ctl.phase.store(MEASURE, Ordering::Relaxed);
        let t0 = Instant::now();
        let end = t0 + total;
        let tick = Duration::from_millis(10);
        let (mut gsum, mut samples) = (0u64, 0u64);
        let mut trace = Vec::new();
        let mut step = 0usize;
        let mut row_start = t0;
        let mut row_ops = 0u64;
        let mut row_pct = first_ratio * 100.0;
        let mut next_row = t0 + Duration::from_secs(1);
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            std::thread::sleep((end - now).min(tick));
            let now = Instant::now();
            let st = store.stats();
            gsum += st.gleaners;
            samples += 1;
            if trace_mode {
                let last_row = now >= end;
                if now >= next_row || last_row {
                    let ops = sum_ops(&ctl);
                    let secs = (now - row_start).as_secs_f64();
                    if secs > 0.0 {
                        trace.push(Row {
                            t: (now - t0).as_secs_f64(),
                            put_pct: row_pct,
                            ops_per_sec: (ops - row_ops) as f64 / secs,
                            gleaners: st.gleaners,
                            log_occupancy: st.log_occupancy,
                        });
                        if !args.json {
                            let r = trace.last().expect("just pushed");
                            println!(
                                "t {:6.2} s  put {:5.1}%  {}ops/s  gleaners {}  log occupancy {:.3}",
                                r.t,
                                r.put_pct,
                                si(r.ops_per_sec),
                                r.gleaners,
                                r.log_occupancy
                            );
                        }
                    }
                    row_start = now;
                    row_ops = ops;
                    while next_row <= now {
                        next_row += Duration::from_secs(1);
                    }
                }
                let want = (((now - t0).as_secs_f64() / args.step_seconds) as usize)
                    .min(args.trace_steps.len() - 1);
                if want != step {
                    step = want;
                    let r = args.trace_steps[step] / 100.0;
                    ctl.put_ratio.store(r.to_bits(), Ordering::Relaxed);
                }
                // A row reports the put percentage in effect at its start.
                if row_start == now {
                    row_pct = args.trace_steps[step];
                }
            }
        }
        ctl.phase.store(STOP, Ordering::Relaxed);
        let elapsed = t0.elapsed();
        let give_up = Instant::now() + STOP_TIMEOUT;
        while ctl.finished.load(Ordering::Acquire) < workers {
            if Instant::now() >= give_up {
                eprintln!(
                    "ember bench engine: {} of {workers} workers still running {} s after the \
                     end of the run (the store hangs); giving up",
                    workers - ctl.finished.load(Ordering::Acquire),
                    STOP_TIMEOUT.as_secs()
                );
                std::process::exit(2);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let stats1 = store.stats();
        let persist = match (p0, region) {
            (Some(a), Some(r)) => Some(delta(a, r.persist_stats())),
            _ => None,
        };
        let mut ws = Vec::with_capacity(workers);
        for r in super::join_all(hs) {
            ws.push(r?);
        }
        Ok(Measured {
            workers: ws,
            elapsed,
            gleaners_avg: gsum as f64 / samples.max(1) as f64,
            gleaner_samples: samples,
            stats0,
            stats1,
            persist,
            trace,
            prefill_s,
            settle_s,
        })
    })
}

/// The thread split of a run.
struct Plan {
    workers: usize,
    static_gleaners: usize,
    dynamic: bool,
    strategy: Strategy,
    buckets: u64,
}

fn validate(args: &EngineArgs) -> BenchResult<()> {
    if args.threads == 0 || args.threads > 256 {
        return Err(format!("--threads {} must be in 1..=256", args.threads));
    }
    if args.keys == 0 || args.keys > 1 << 34 {
        return Err(format!("--keys {} must be in 1..=2^34", args.keys));
    }
    let need = 1 + decimal_digits(args.keys - 1);
    if args.key_size < need || args.key_size > index::MAX_KEY {
        return Err(format!(
            "--key-size {} must be in {need}..={} for {} keys (\"k\" and {} digits)",
            args.key_size,
            index::MAX_KEY,
            args.keys,
            need - 1
        ));
    }
    if args.value_size > 1 << 20 {
        return Err(format!(
            "--value-size {} must be at most 1 MiB",
            args.value_size
        ));
    }
    if !(0.0..=1.0).contains(&args.put_ratio) {
        return Err(format!(
            "--put-ratio {} must be a fraction in [0, 1] (e.g. 0.02 for 2%)",
            args.put_ratio
        ));
    }
    if !(0.0..1.0).contains(&args.zipf) {
        return Err(format!(
            "--zipf {} must be in [0, 1) (0 = uniform)",
            args.zipf
        ));
    }
    if !(args.seconds > 0.0 && args.seconds <= 3600.0) {
        return Err(format!("--seconds {} must be in (0, 3600]", args.seconds));
    }
    if !(0.0..=3600.0).contains(&args.warmup) {
        return Err(format!("--warmup {} must be in [0, 3600]", args.warmup));
    }
    if args.cdf_points > 10_000 {
        return Err(format!(
            "--cdf-points {} must be at most 10000",
            args.cdf_points
        ));
    }
    if !args.trace_steps.is_empty() {
        if let Some(bad) = args
            .trace_steps
            .iter()
            .find(|x| !(0.0..=100.0).contains(*x))
        {
            return Err(format!(
                "--trace-steps: {bad} is not a put percentage in [0, 100]"
            ));
        }
        let total = args.step_seconds * args.trace_steps.len() as f64;
        if !(args.step_seconds > 0.0 && total <= 86_400.0) {
            return Err(format!(
                "--step-seconds {} must be > 0 (and the trace at most a day)",
                args.step_seconds
            ));
        }
    }
    if args.backlog > 0 {
        let dynamic = matches!(args.engine, EngineKind::Bullet(v) if v.dynamic());
        if !dynamic || args.threads != 1 || args.recovery || !args.trace_steps.is_empty() {
            return Err("--backlog needs a dynamic Bullet variant (bullet, bullet-dyn, bullet-full), --threads 1, and neither --recovery nor --trace-steps".into());
        }
        let rec = engine::crl::record_len(args.key_size, args.value_size);
        let room = (args.logs as u64).saturating_mul(args.log_size.saturating_mul(MIB)) / 10 * 9;
        if args.backlog.saturating_mul(rec) > room {
            return Err(format!(
                "--backlog {}: {} of records do not fit in 90% of the logs ({} x {} MiB); raise --logs or --log-size",
                args.backlog,
                human_bytes(args.backlog.saturating_mul(rec)),
                args.logs,
                args.log_size
            ));
        }
    }
    if let EngineKind::Bullet(_) = args.engine {
        if args.logs == 0 || args.logs > 4096 {
            return Err(format!("--logs {} must be in 1..=4096", args.logs));
        }
        if args.log_size == 0 || args.log_size > 1 << 20 {
            return Err(format!(
                "--log-size {} (MiB) must be in 1..=1048576",
                args.log_size
            ));
        }
        if args.epoch_ms == 0 {
            return Err("--epoch-ms must be at least 1".into());
        }
    }
    Ok(())
}

fn plan(args: &EngineArgs) -> BenchResult<Plan> {
    validate(args)?;
    let (workers, static_gleaners, dynamic) = match args.engine {
        EngineKind::Bullet(v) if !v.dynamic() => {
            let g = (args.threads / 2).max(1);
            (args.threads.saturating_sub(g).max(1), g, false)
        }
        EngineKind::Bullet(_) => (args.threads, 0, true),
        _ => (args.threads, 0, false),
    };
    let strategy = Strategy::parse(&args.strategy).map_err(err)?;
    let buckets = if args.buckets == 0 {
        args.keys.next_power_of_two()
    } else {
        args.buckets
    };
    Ok(Plan {
        workers,
        static_gleaners,
        dynamic,
        strategy,
        buckets,
    })
}

/// The heap of a heap-backed store.
fn make_heap(args: &EngineArgs, plan: &Plan, logs_bytes: u64) -> BenchResult<TempHeap> {
    let size = if args.heap_size != 0 {
        args.heap_size.saturating_mul(MIB)
    } else {
        let per_key = (args.key_size as u64 + args.value_size as u64 + 256).saturating_mul(2);
        args.keys
            .saturating_mul(per_key)
            .saturating_add(logs_bytes)
            .saturating_add(256 * MIB)
            .next_multiple_of(MIB)
    };
    // Per thread: a session's backend handle and (st, lfr) its side table's;
    // plus the store's gleaners, the advancer and drain.
    let nslots =
        (2 * (plan.workers + plan.static_gleaners) as u64 + 16).max(Geometry::default().nslots);
    let opts = HeapOptions {
        size,
        max_size: size.saturating_mul(4),
        strategy: plan.strategy,
        fence_ns: args.fence_ns,
        read_ns: args.read_ns,
        geometry: Geometry {
            nslots,
            ..Geometry::default()
        },
        ..Default::default()
    };
    TempHeap::create(args.heap.as_deref(), "-engine", &opts)
}

/// What the report needs from the store and its heap.
struct Context<'a> {
    name: String,
    durability: Durability,
    heap: Option<&'a TempHeap>,
    backend: Option<BackendKind>,
}

pub fn run(args: &EngineArgs) -> BenchResult<()> {
    let plan = plan(args)?;
    let machine = Machine::detect();
    let p = Params {
        keys: args.keys,
        key_size: args.key_size,
        value_size: args.value_size,
        seed: args.seed,
        dynamic: plan.dynamic,
        chooser: KeyChooser::new(args.keys, args.zipf),
    };
    let backend = BackendOptions {
        kind: args.backend,
        buckets: plan.buckets,
        ..BackendOptions::default()
    };
    let run = Run {
        args,
        plan: &plan,
        machine: &machine,
        p: &p,
    };
    match args.engine {
        EngineKind::Volatile => {
            let store = VolatileStore::new(plan.buckets as usize);
            run.store(&store, None, None, || {
                store.wait_resize();
                Ok(())
            })
        }
        EngineKind::Direct => {
            let tmp = make_heap(args, &plan, 0)?;
            let store = DirectStore::create(&tmp.heap, &backend).map_err(err)?;
            run.store(&store, Some(&tmp), Some(args.backend), || Ok(()))
        }
        EngineKind::Bullet(variant) => {
            let log_size = args.log_size * MIB;
            let tmp = make_heap(args, &plan, (args.logs as u64).saturating_mul(log_size))?;
            let opts = BulletOptions {
                variant,
                logs: args.logs,
                log_size,
                backend,
                frontend_buckets: plan.buckets as usize,
                cache_entries: 0,
                epoch: Duration::from_millis(args.epoch_ms),
                static_gleaners: plan.static_gleaners,
                group_commit: false,
                role_threads: 0,
                preallocate_logs: true,
                ..Default::default()
            };
            let store = BulletStore::create(&tmp.heap, &opts).map_err(err)?;
            if args.backlog > 0 {
                prefill(&store, &p, 1)?;
                store.drain().map_err(err)?;
                return time_backlog(args, &p, &store);
            }
            run.store(&store, Some(&tmp), Some(args.backend), || {
                store.drain().map_err(err)
            })?;
            if args.recovery {
                drop(store);
                time_recovery(args, tmp, &opts)?;
            }
            Ok(())
        }
    }
}

/// `--backlog`: puts `args.backlog` records from one session (with one
/// session and no role threads nobody takes the gleaner role), then times
/// `drain`, which applies them (the advancer's idle gleaning may join in).
fn time_backlog(args: &EngineArgs, p: &Params, store: &BulletStore) -> BenchResult<()> {
    let mut sess = store.session().map_err(err)?;
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let mut key = vec![0u8; p.key_size];
    let mut val = vec![b'b'; p.value_size];
    let mut distinct = std::collections::HashSet::new();
    let start = store.stats();
    let t = Instant::now();
    for i in 0..args.backlog {
        let k = p.chooser.next(&mut rng);
        distinct.insert(k);
        encode_key(k, &mut key);
        let m = val.len().min(8);
        val[..m].copy_from_slice(&i.to_le_bytes()[..m]);
        sess.apply(&key, Op::Put(&val)).map_err(err)?;
    }
    let put_ms = t.elapsed().as_secs_f64() * 1e3;
    drop(sess);
    let before = store.stats();
    let ps0 = store.heap().region().persist_stats();
    let cpu0 = process_cpu_seconds();
    let t = Instant::now();
    store.drain().map_err(err)?;
    let wall = t.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu0;
    let after = store.stats();
    let ps1 = store.heap().region().persist_stats();
    let (fences, msyncs) = (ps1.fences - ps0.fences, ps1.msyncs - ps0.msyncs);
    let applied = after.records_applied - before.records_applied;
    let collapsed = after.records_collapsed - before.records_collapsed;
    let durability = store.heap().region().strategy().name();
    let v = json!({
        "bench": "engine-backlog",
        "engine": store.name(),
        "keys": args.keys,
        "puts": args.backlog,
        "distinct_keys": distinct.len(),
        "put_ms": put_ms,
        "applied_before_drain": before.records_applied - start.records_applied,
        "drain_ms": wall * 1e3,
        "drain_cpu_ms": cpu * 1e3,
        "records_applied": applied,
        "records_collapsed": collapsed,
        "drain_fences": fences,
        "drain_msyncs": msyncs,
        "durability": durability,
    });
    store.close().map_err(err)?;
    if args.json {
        println!("{v}");
    } else {
        println!(
            "backlog of {} puts on {} keys ({} applied before the drain): drained in {:.1} ms, {:.1} ms of CPU ({:.0} ns a record, {} collapsed; {} fences, {} msyncs); {}",
            args.backlog,
            distinct.len(),
            before.records_applied - start.records_applied,
            wall * 1e3,
            cpu * 1e3,
            cpu * 1e9 / applied.max(1) as f64,
            collapsed,
            fences,
            msyncs,
            durability
        );
    }
    Ok(())
}

/// User + system CPU time of the whole process, in seconds.
fn process_cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value, and getrusage only fills
    // the struct it is given.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Reopens the closed Bullet heap and times its recovery: the heap's open, the
/// index recovery (leak sweep), and the replay of the logs into the frontend.
fn time_recovery(args: &EngineArgs, tmp: TempHeap, opts: &BulletOptions) -> BenchResult<()> {
    let hopts = HeapOptions {
        strategy: tmp.heap.region().strategy(),
        fence_ns: args.fence_ns,
        read_ns: args.read_ns,
        ..Default::default()
    };
    let file = tmp.close();
    let t = Instant::now();
    let rec = Heap::open(file.path(), &hopts).map_err(err)?;
    let (store, r) = BulletStore::open(rec, opts).map_err(err)?;
    let micros = t.elapsed().as_micros() as u64;
    let v = json!({
        "bench": "engine-recovery",
        "engine": store.name(),
        "keys": args.keys,
        "recovery_ms": micros as f64 / 1000.0,
        "replay_ms": r.replay_micros as f64 / 1000.0,
        "log_bytes": r.log_bytes,
        "log_records": r.records,
        "replayed_records": r.replayed,
        "frontend_keys": r.keys,
        "index_slots_examined": r.index.slots,
        "durability": store.heap().region().strategy().name(),
    });
    store.close().map_err(err)?;
    drop(store);
    if args.json {
        println!("{v}");
    } else {
        println!(
            "recovery: {:.1} ms ({:.1} ms replaying {} records, {} of log, into {} frontend keys)",
            micros as f64 / 1000.0,
            r.replay_micros as f64 / 1000.0,
            r.records,
            crate::util::human_bytes(r.log_bytes),
            r.keys
        );
    }
    Ok(())
}

/// One benchmark run's fixed inputs.
struct Run<'a> {
    args: &'a EngineArgs,
    plan: &'a Plan,
    machine: &'a Machine,
    p: &'a Params,
}

impl Run<'_> {
    /// Measures `store` (after `settle` ran on the prefilled store), closes it and
    /// prints the report.
    fn store<S: Store>(
        &self,
        store: &S,
        heap: Option<&TempHeap>,
        backend: Option<BackendKind>,
        settle: impl FnOnce() -> BenchResult<()>,
    ) -> BenchResult<()> {
        let region = heap.map(|t| t.heap.region());
        let m = measure(store, self.args, self.p, self.plan.workers, region, settle)?;
        let ctx = Context {
            name: store.name(),
            durability: store.durability(),
            heap,
            backend,
        };
        store.close().map_err(err)?;
        report(self.args, self.plan, self.machine, &ctx, &m)
    }
}

fn report(
    args: &EngineArgs,
    plan: &Plan,
    machine: &Machine,
    ctx: &Context<'_>,
    m: &Measured,
) -> BenchResult<()> {
    let mut get_hist = new_hist();
    let mut put_hist = new_hist();
    let (mut gets, mut puts, mut misses, mut gleans) = (0u64, 0u64, 0u64, 0u64);
    for w in &m.workers {
        get_hist
            .add(&w.get_hist)
            .map_err(|e| format!("histogram: {e:?}"))?;
        put_hist
            .add(&w.put_hist)
            .map_err(|e| format!("histogram: {e:?}"))?;
        gets += w.gets;
        puts += w.puts;
        misses += w.get_misses;
        gleans += w.gleans;
    }
    let ops = gets + puts;
    let secs = m.elapsed.as_secs_f64().max(1e-9);
    let rate = ops as f64 / secs;
    let opsf = ops.max(1) as f64;
    let (a, b) = (&m.stats0, &m.stats1);
    let d = |x: u64, y: u64| y.saturating_sub(x);
    let is_bullet = matches!(args.engine, EngineKind::Bullet(_));
    let trace_mode = !args.trace_steps.is_empty();
    let (durability, power_safe) = match ctx.durability {
        Durability::Volatile => ("volatile", false),
        Durability::Heap => (
            plan.strategy.name(),
            plan.strategy.power_safe_on_ordinary_file(),
        ),
    };
    let gq = |q: f64| get_hist.value_at_quantile(q);
    let pq = |q: f64| put_hist.value_at_quantile(q);
    let persist = m.persist;

    let mut v = Map::new();
    let mut put = |k: &str, x: Value| {
        v.insert(k.to_string(), x);
    };
    put("bench", json!("engine"));
    put("engine", json!(ctx.name));
    put("backend", json!(ctx.backend.map(|k| k.name())));
    put("threads", json!(args.threads));
    put("workers", json!(plan.workers));
    put("static_gleaners", json!(plan.static_gleaners));
    put("dynamic_roles", json!(plan.dynamic));
    put("keys", json!(args.keys));
    put("key_size", json!(args.key_size));
    put("value_size", json!(args.value_size));
    put(
        "put_ratio",
        if trace_mode {
            Value::Null
        } else {
            json!(args.put_ratio)
        },
    );
    put("zipf", json!(args.zipf));
    put(
        "key_distribution",
        json!(if args.zipf == 0.0 {
            "uniform"
        } else {
            "scrambled-zipfian"
        }),
    );
    put("seconds", json!(secs));
    put("warmup", json!(args.warmup));
    put("durability", json!(durability));
    put("power_safe_on_ordinary_file", json!(power_safe));
    put("fence_ns", json!(args.fence_ns));
    put("read_ns", json!(args.read_ns));
    put("logs", json!(is_bullet.then_some(args.logs)));
    put("log_size_mib", json!(is_bullet.then_some(args.log_size)));
    put("epoch_ms", json!(is_bullet.then_some(args.epoch_ms)));
    put("buckets", json!(plan.buckets));
    put("machine", machine.to_json());
    put("ops", json!(ops));
    put("get_ops", json!(gets));
    put("put_ops", json!(puts));
    put("get_misses", json!(misses));
    put("ops_per_sec", json!(rate));
    put("get_p50_ns", json!(gq(0.5)));
    put("get_p90_ns", json!(gq(0.9)));
    put("get_p99_ns", json!(gq(0.99)));
    put("get_p999_ns", json!(gq(0.999)));
    put("get_max_ns", json!(get_hist.max()));
    put("get_mean_ns", json!(get_hist.mean()));
    put("put_p50_ns", json!(pq(0.5)));
    put("put_p90_ns", json!(pq(0.9)));
    put("put_p99_ns", json!(pq(0.99)));
    put("put_p999_ns", json!(pq(0.999)));
    put("put_max_ns", json!(put_hist.max()));
    put("put_mean_ns", json!(put_hist.mean()));
    put("gleaners_avg", json!(m.gleaners_avg));
    put("gleaner_samples", json!(m.gleaner_samples));
    put("worker_gleans", json!(gleans));
    put(
        "fences_per_op",
        json!(persist.map(|p| p.fences as f64 / opsf)),
    );
    put(
        "flushes_per_op",
        json!(persist.map(|p| p.flushes as f64 / opsf)),
    );
    put(
        "msyncs_per_op",
        json!(persist.map(|p| p.msyncs as f64 / opsf)),
    );
    put(
        "log_full_waits",
        json!(d(a.log_full_waits, b.log_full_waits)),
    );
    put(
        "records_appended",
        json!(d(a.records_appended, b.records_appended)),
    );
    put(
        "records_applied",
        json!(d(a.records_applied, b.records_applied)),
    );
    put(
        "records_collapsed",
        json!(d(a.records_collapsed, b.records_collapsed)),
    );
    put("log_occupancy_end", json!(b.log_occupancy));
    put("epochs", json!(d(a.epochs, b.epochs)));
    put("store_keys_end", json!(b.keys));
    put("prefill_s", json!(m.prefill_s));
    put("settle_s", json!(m.settle_s));
    put(
        "heap",
        json!(ctx.heap.map(|h| h.path().display().to_string())),
    );
    put("heap_size", json!(ctx.heap.map(|h| h.heap.region().size())));
    if trace_mode {
        put("trace_steps_pct", json!(args.trace_steps));
        put("step_seconds", json!(args.step_seconds));
        put(
            "trace",
            Value::Array(
                m.trace
                    .iter()
                    .map(|r| {
                        json!({
                            "t": r.t,
                            "put_pct": r.put_pct,
                            "ops_per_sec": r.ops_per_sec,
                            "gleaners": r.gleaners,
                            "log_occupancy": r.log_occupancy,
                        })
                    })
                    .collect(),
            ),
        );
    }
    if args.cdf_points > 0 {
        let mut all_hist = get_hist.clone();
        all_hist
            .add(&put_hist)
            .map_err(|e| format!("histogram: {e:?}"))?;
        let qs = cdf_quantiles(args.cdf_points);
        put("get_cdf", cdf(&get_hist, &qs));
        put("put_cdf", cdf(&put_hist, &qs));
        put("all_cdf", cdf(&all_hist, &qs));
        put("all_p99_ns", json!(all_hist.value_at_quantile(0.99)));
    }
    put(
        "latency_definition",
        json!("per operation: clock read right before and right after it (key choice excluded)"),
    );
    put(
        "counters_definition",
        json!("records_*, log_full_waits, epochs and *_per_op: differences over the measured interval"),
    );

    if args.json {
        println!("{}", Value::Object(v));
        return Ok(());
    }
    println!(
        "ember bench engine: {}{}, {} thread{} ({} worker{}{}), {} keys, {}-byte keys, \
         {}-byte values, {}, {}",
        ctx.name,
        ctx.backend
            .map(|k| format!(" (backend {})", k.name()))
            .unwrap_or_default(),
        args.threads,
        if args.threads == 1 { "" } else { "s" },
        plan.workers,
        if plan.workers == 1 { "" } else { "s" },
        if plan.static_gleaners > 0 {
            format!(
                " + {} static gleaner{}",
                plan.static_gleaners,
                if plan.static_gleaners == 1 { "" } else { "s" }
            )
        } else if plan.dynamic {
            " with dynamic roles".into()
        } else {
            String::new()
        },
        args.keys,
        args.key_size,
        args.value_size,
        if trace_mode {
            format!("put % steps {:?}", args.trace_steps)
        } else {
            format!("put ratio {}", args.put_ratio)
        },
        if args.zipf == 0.0 {
            "uniform keys".to_string()
        } else {
            format!("scrambled zipfian {}", args.zipf)
        }
    );
    println!("machine:    {}", machine.line());
    match ctx.heap {
        Some(h) => println!(
            "durability: {durability} ({}power-safe on an ordinary file)   fence_ns: {}   \
             read_ns: {}   heap: {} ({})",
            if power_safe { "" } else { "not " },
            args.fence_ns,
            args.read_ns,
            h.path().display(),
            human_bytes(h.heap.region().size())
        ),
        None => println!("durability: volatile (nothing survives the process)"),
    }
    println!(
        "{}ops/s over {:.2} s ({} gets, {} puts, {} get misses); prefill {:.2} s, settle {:.2} s",
        si(rate),
        secs,
        gets,
        puts,
        misses,
        m.prefill_s,
        m.settle_s
    );
    println!(
        "get latency p50 {} ns, p99 {} ns; put latency p50 {} ns, p99 {} ns",
        gq(0.5),
        gq(0.99),
        pq(0.5),
        pq(0.99)
    );
    if let Some(p) = persist {
        println!(
            "{:.3} fences/op, {:.3} flushes/op",
            p.fences as f64 / opsf,
            p.flushes as f64 / opsf
        );
    }
    if is_bullet {
        println!(
            "gleaners avg {:.2} ({} worker gleans); records appended {}, applied {}, \
             collapsed {}; log full waits {}; log occupancy at end {:.3}",
            m.gleaners_avg,
            gleans,
            d(a.records_appended, b.records_appended),
            d(a.records_applied, b.records_applied),
            d(a.records_collapsed, b.records_collapsed),
            d(a.log_full_waits, b.log_full_waits),
            b.log_occupancy
        );
    }
    Ok(())
}

/// `n` evenly spaced quantiles (1/n, 2/n, ..., 1) and the tail points 0.9, 0.95,
/// 0.99, 0.995, 0.999 and 0.9999, sorted and without duplicates.
fn cdf_quantiles(n: usize) -> Vec<f64> {
    let mut qs: Vec<f64> = (1..=n).map(|i| i as f64 / n as f64).collect();
    qs.extend([0.9, 0.95, 0.99, 0.995, 0.999, 0.9999]);
    qs.sort_by(|a, b| a.total_cmp(b));
    qs.dedup_by(|a, b| (*a - *b).abs() < 1e-12);
    qs
}

/// `[quantile, ns]` pairs of `h` (empty when nothing was recorded).
fn cdf(h: &Histogram<u64>, qs: &[f64]) -> Value {
    if h.is_empty() {
        return json!([]);
    }
    Value::Array(
        qs.iter()
            .map(|&q| json!([q, h.value_at_quantile(q)]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_quantiles_cover_the_tail() {
        let qs = cdf_quantiles(10);
        assert_eq!(qs.first(), Some(&0.1));
        assert_eq!(qs.last(), Some(&1.0));
        assert!(qs.contains(&0.999) && qs.contains(&0.9999));
        assert!(qs.windows(2).all(|w| w[0] < w[1]), "{qs:?}");
        assert_eq!(qs.iter().filter(|&&q| q == 0.9).count(), 1);
    }

    #[test]
    fn keys_are_exact() {
        let mut k = [0u8; 8];
        encode_key(42, &mut k);
        assert_eq!(&k, b"k0000042");
        encode_key(9_999_999, &mut k);
        assert_eq!(&k, b"k9999999");
        assert_eq!(decimal_digits(0), 1);
        assert_eq!(decimal_digits(9), 1);
        assert_eq!(decimal_digits(10), 2);
        assert_eq!(decimal_digits(999_999), 6);
    }

    #[test]
    fn engines_parse() {
        assert_eq!(
            EngineKind::parse("bullet"),
            Ok(EngineKind::Bullet(Variant::Full))
        );
        assert_eq!(
            EngineKind::parse("bullet-st"),
            Ok(EngineKind::Bullet(Variant::St))
        );
        assert_eq!(EngineKind::parse("direct"), Ok(EngineKind::Direct));
        assert!(EngineKind::parse("bullet-x").is_err());
        assert!(EngineKind::parse("bullet-+st").is_err());
        assert!(EngineKind::parse("redis").is_err());
    }

    #[test]
    fn fnv_matches_ycsb() {
        // FNV-1a 64 of eight zero bytes.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for _ in 0..8 {
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(fnv1a64(0), (h as i64).wrapping_abs() as u64);
        assert!(fnv1a64(12345) <= i64::MAX as u64 + 1);
    }

    #[test]
    fn zipfian_in_range_and_skewed() {
        let mut rng = SmallRng::seed_from_u64(7);
        for keys in [1u64, 2, 3, 1000, 123_457] {
            let c = KeyChooser::new(keys, 0.99);
            for _ in 0..50_000 {
                assert!(c.next(&mut rng) < keys);
            }
            let z = Zipfian::new(keys, 0.99);
            assert_eq!(z.item(0.0), 0);
            assert!(z.item(0.999_999_999) < keys);
        }
        // Unscrambled: item 0 is the most frequent, close to 1/zeta(n).
        let n = 1000u64;
        let z = Zipfian::new(n, 0.99);
        let mut counts = vec![0u64; n as usize];
        let draws = 400_000;
        for _ in 0..draws {
            counts[z.item(rng.random::<f64>()) as usize] += 1;
        }
        let max = counts.iter().enumerate().max_by_key(|(_, c)| **c).unwrap();
        assert_eq!(max.0, 0);
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
        let expect = draws as f64 / zeta(n, 0.99);
        let got = counts[0] as f64;
        assert!((got - expect).abs() < 0.05 * expect, "{got} vs {expect}");
        // Scrambled: the hottest key is item 0's hash.
        let c = KeyChooser::new(n, 0.99);
        let mut counts = vec![0u64; n as usize];
        for _ in 0..draws {
            counts[c.next(&mut rng) as usize] += 1;
        }
        let max = counts.iter().enumerate().max_by_key(|(_, c)| **c).unwrap();
        assert_eq!(max.0 as u64, fnv1a64(0) % n);
    }

    #[test]
    fn zipf_zero_is_uniform() {
        let c = KeyChooser::new(10, 0.0);
        assert!(matches!(c, KeyChooser::Uniform { keys: 10 }));
        let mut rng = SmallRng::seed_from_u64(3);
        let mut counts = [0u64; 10];
        for _ in 0..200_000 {
            counts[c.next(&mut rng) as usize] += 1;
        }
        for n in counts {
            assert!((19_000..=21_000).contains(&n), "{counts:?}");
        }
    }
}
