//! `ember bench alloc`: allocation + free throughput per thread of the persistent
//! allocator against the system allocator.
//!
//! Workload per thread: a FIFO window of `window` live blocks; each op allocates one
//! block, stores 8 bytes into it, and frees the oldest block once the window is full.
//! The modes run as alternating rounds (system, immediate, batched, system, ...) in
//! one process, and the medians over rounds are reported:
//!
//! * `system`: `std::alloc::alloc` / `dealloc` with the same sizes.
//! * `immediate`: `ThreadHeap::alloc`, an 8-byte `Region::write`, `ThreadHeap::free`.
//! * `batched`: as `immediate`, but frees are announced with `prepare_free` and
//!   redeemed with `Heap::free_tickets` every `batch` frees (the pattern
//!   epoch-based reclamation uses).
//!
//! The allocator's own persistence is on in every pmem mode (whatever it flushes
//! and fences is counted). The 8-byte store is the same user work on both sides and
//! is not flushed unless `--flush-data` is given (then the pmem modes also flush
//! it, a cost the system allocator has no counterpart for).

use super::{delta, median, si, BenchResult, Machine, TempHeap};
use crate::util::human_bytes;
use clap::Args;
use pmem::layout::MIB;
use pmem::{FreeTicket, Geometry, Heap, HeapOptions, PPtr, Strategy, ThreadHeap};
use serde_json::{json, Value};
use std::alloc::Layout;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct AllocArgs {
    /// Worker threads (each with its own heap thread slot).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Block size in bytes (at least 8).
    #[arg(long, default_value_t = 64)]
    pub size: u64,
    /// Operations per thread per round.
    #[arg(long, default_value_t = 500_000)]
    pub ops: u64,
    /// Rounds per mode (modes alternate round by round).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Live blocks per thread (FIFO window).
    #[arg(long, default_value_t = 1024)]
    pub window: usize,
    /// Frees per `free_tickets` call in batched mode.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Persistence strategy: auto, clwb, clflushopt, clflush, fence-only or msync.
    #[arg(long, default_value = "auto")]
    pub strategy: String,
    /// Emulated extra latency per fence, in ns.
    #[arg(long, default_value_t = 0)]
    pub fence_ns: u64,
    /// Heap file to create (must not exist). Default: <tmp>/ember-bench-<pid>.heap.
    /// Removed at the end, also when the bench is stopped by SIGINT, SIGTERM or
    /// SIGHUP or panics; a SIGKILL leaves it.
    #[arg(long)]
    pub heap: Option<PathBuf>,
    /// Also flush the 8 bytes each op stores (pmem modes only).
    #[arg(long)]
    pub flush_data: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    System,
    Immediate,
    Batched,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::System, Mode::Immediate, Mode::Batched];

    fn name(self) -> &'static str {
        match self {
            Mode::System => "system",
            Mode::Immediate => "immediate",
            Mode::Batched => "batched",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Mode::System => "std::alloc::alloc/dealloc",
            Mode::Immediate => "pmem alloc + store; ThreadHeap::free",
            Mode::Batched => "pmem alloc + store; prepare_free + free_tickets per batch",
        }
    }
}

/// Parameters shared by every worker.
struct Work<'a> {
    heap: &'a Heap,
    size: u64,
    ops: u64,
    window: usize,
    batch: usize,
    threads: usize,
    flush_data: bool,
    /// The system allocator's layout for one block.
    layout: Layout,
}

/// The barriers of one round: everyone ready; the coordinator has read the counters;
/// the timed part is over; the coordinator has read the counters again.
struct Phases {
    ready: Barrier,
    go: Barrier,
    done: Barrier,
    snapped: Barrier,
}

impl Phases {
    fn new(n: usize) -> Self {
        Self {
            ready: Barrier::new(n),
            go: Barrier::new(n),
            done: Barrier::new(n),
            snapped: Barrier::new(n),
        }
    }
}

/// One round of one mode.
#[derive(Clone, Copy, Debug)]
struct Round {
    /// Mean over threads of ops / that thread's elapsed time.
    ops_per_sec_per_thread: f64,
    fences_per_op: f64,
    flushes_per_op: f64,
    msyncs_per_op: f64,
}

/// The medians of a mode over its rounds.
struct Summary {
    mode: Mode,
    rounds: Vec<Round>,
    ops_per_sec_per_thread: f64,
    ns_per_op: f64,
    fences_per_op: f64,
    flushes_per_op: f64,
    msyncs_per_op: f64,
}

impl Summary {
    fn of(mode: Mode, rounds: Vec<Round>) -> Summary {
        let m = |f: fn(&Round) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
        let ops = m(|r| r.ops_per_sec_per_thread);
        Summary {
            mode,
            ops_per_sec_per_thread: ops,
            ns_per_op: if ops > 0.0 { 1e9 / ops } else { 0.0 },
            fences_per_op: m(|r| r.fences_per_op),
            flushes_per_op: m(|r| r.flushes_per_op),
            msyncs_per_op: m(|r| r.msyncs_per_op),
            rounds,
        }
    }
}

pub fn run(args: &AllocArgs) -> BenchResult<()> {
    if args.threads == 0 || args.threads > 1024 {
        return Err(format!("--threads {} must be in 1..=1024", args.threads));
    }
    if args.size < 8 {
        return Err(format!(
            "--size {} must be at least 8 (each op stores 8 bytes)",
            args.size
        ));
    }
    for (name, v) in [
        ("--ops", args.ops),
        ("--rounds", args.rounds as u64),
        ("--window", args.window as u64),
        ("--batch", args.batch as u64),
    ] {
        if v == 0 {
            return Err(format!("{name} must be at least 1"));
        }
    }
    let layout = Layout::from_size_align(args.size as usize, 16)
        .map_err(|e| format!("--size {}: {e}", args.size))?;
    let strategy = Strategy::parse(&args.strategy).map_err(|e| e.to_string())?;
    let machine = Machine::detect();

    // Enough room for every thread's window four times over, plus a margin.
    let need = (args.threads as u64)
        .saturating_mul(args.window as u64)
        .saturating_mul(args.size)
        .saturating_mul(4)
        .saturating_add(64 * MIB);
    let opts = HeapOptions {
        size: need.max(256 * MIB),
        strategy,
        fence_ns: args.fence_ns,
        geometry: Geometry {
            nslots: (args.threads as u64).max(Geometry::default().nslots),
            ..Geometry::default()
        },
        ..Default::default()
    };
    let th = TempHeap::create(args.heap.as_deref(), "", &opts)?;
    let heap = &th.heap;
    let heap_path = th.path().display().to_string();
    let heap_size = heap.region().size();

    let work = |ops| Work {
        heap,
        size: args.size,
        ops,
        window: args.window,
        batch: args.batch,
        threads: args.threads,
        flush_data: args.flush_data,
        layout,
    };
    // Warm-up (not measured): fault in the slabs, warm the system allocator.
    let warm = work(args.ops.min(4 * args.window as u64));
    for mode in Mode::ALL {
        round(&warm, mode)?;
    }
    let w = work(args.ops);
    let mut per_mode: Vec<Vec<Round>> = vec![Vec::new(); Mode::ALL.len()];
    for _ in 0..args.rounds {
        for (i, mode) in Mode::ALL.into_iter().enumerate() {
            per_mode[i].push(round(&w, mode)?);
        }
    }
    let sums: Vec<Summary> = Mode::ALL
        .into_iter()
        .zip(per_mode)
        .map(|(m, r)| Summary::of(m, r))
        .collect();
    let sys = sums[0].ops_per_sec_per_thread;
    let ratio = |s: &Summary| {
        if sys > 0.0 {
            s.ops_per_sec_per_thread / sys
        } else {
            0.0
        }
    };

    if args.json {
        let mut modes = serde_json::Map::new();
        for s in &sums {
            modes.insert(
                s.mode.name().into(),
                json!({
                    "what": s.mode.describe(),
                    "ops_per_sec_per_thread": s.ops_per_sec_per_thread,
                    "ns_per_op": s.ns_per_op,
                    "fences_per_op": s.fences_per_op,
                    "flushes_per_op": s.flushes_per_op,
                    "msyncs_per_op": s.msyncs_per_op,
                    "ratio_vs_system": ratio(s),
                    "rounds_ops_per_sec_per_thread":
                        s.rounds.iter().map(|r| r.ops_per_sec_per_thread).collect::<Vec<_>>(),
                }),
            );
        }
        let v: Value = json!({
            "bench": "alloc",
            "machine": machine.to_json(),
            "strategy": strategy.name(),
            "fence_ns": args.fence_ns,
            "threads": args.threads,
            "size": args.size,
            "ops_per_thread_per_round": args.ops,
            "rounds": args.rounds,
            "window": args.window,
            "batch": args.batch,
            "heap": heap_path,
            "heap_size": heap_size,
            "ratio_definition": "ops_per_sec_per_thread / system ops_per_sec_per_thread",
            "modes": modes,
        });
        println!("{v}");
    } else {
        println!("ember bench alloc: persistent allocator vs system allocator");
        println!("machine:  {}", machine.line());
        println!(
            "strategy: {}   fence_ns: {}   threads: {}",
            strategy.name(),
            args.fence_ns,
            args.threads
        );
        println!(
            "workload: {}-byte blocks, FIFO window {}, {} ops/thread/round, {} rounds per mode \
             (alternating {}), batch {}",
            args.size,
            args.window,
            args.ops,
            args.rounds,
            Mode::ALL.map(Mode::name).join(", "),
            args.batch
        );
        println!(
            "heap:     {heap_path}, {} (removed at exit)",
            human_bytes(heap_size)
        );
        println!(
            "op = alloc + 8-byte store{} + free of the oldest block once the window is full",
            if args.flush_data {
                " (+ flush of it for pmem)"
            } else {
                ""
            }
        );
        println!("ratio_vs_system = ops_per_sec_per_thread / system's (medians; 1.0 = as fast as the system allocator)");
        println!();
        println!(
            "{:<10} {:>22} {:>10} {:>14} {:>15} {:>16}",
            "mode",
            "ops_per_sec_per_thread",
            "ns_per_op",
            "fences_per_op",
            "flushes_per_op",
            "ratio_vs_system"
        );
        for s in &sums {
            println!(
                "{:<10} {:>22} {:>10.1} {:>14.4} {:>15.4} {:>16.3}",
                s.mode.name(),
                si(s.ops_per_sec_per_thread),
                s.ns_per_op,
                s.fences_per_op,
                s.flushes_per_op,
                ratio(s)
            );
        }
        println!();
        for s in &sums {
            let rs: Vec<String> = s
                .rounds
                .iter()
                .map(|r| si(r.ops_per_sec_per_thread).trim_end().to_string())
                .collect();
            println!(
                "{:<10} rounds (ops/s/thread): {}",
                s.mode.name(),
                rs.join(", ")
            );
        }
    }
    drop(th);
    Ok(())
}

/// Runs one round of `mode` on `w.threads` threads.
fn round(w: &Work<'_>, mode: Mode) -> BenchResult<Round> {
    let region = w.heap.region();
    let ph = Phases::new(w.threads + 1);
    let (s0, s1, results) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..w.threads)
            .map(|_| {
                s.spawn(|| match mode {
                    Mode::System => system_worker(w, &ph),
                    Mode::Immediate | Mode::Batched => pmem_worker(w, &ph, mode),
                })
            })
            .collect();
        ph.ready.wait();
        let s0 = region.persist_stats();
        ph.go.wait();
        ph.done.wait();
        let s1 = region.persist_stats();
        ph.snapped.wait();
        let results: Vec<BenchResult<Duration>> = super::join_all(handles);
        (s0, s1, results)
    });
    let mut rate_sum = 0.0;
    for r in results {
        let el = r?;
        rate_sum += w.ops as f64 / el.as_secs_f64().max(1e-9);
    }
    let total_ops = (w.ops * w.threads as u64) as f64;
    let d = delta(s0, s1);
    Ok(Round {
        ops_per_sec_per_thread: rate_sum / w.threads as f64,
        fences_per_op: d.fences as f64 / total_ops,
        flushes_per_op: d.flushes as f64 / total_ops,
        msyncs_per_op: d.msyncs as f64 / total_ops,
    })
}

/// One thread of a persistent-allocator round. Always passes every barrier, also
/// when something fails, so that the other threads cannot hang.
fn pmem_worker(w: &Work<'_>, ph: &Phases, mode: Mode) -> BenchResult<Duration> {
    let mut th = w.heap.thread().map_err(|e| e.to_string());
    let mut win: VecDeque<PPtr<u8>> = VecDeque::with_capacity(w.window + 1);
    let mut tickets: Vec<FreeTicket> = Vec::with_capacity(w.batch);
    ph.ready.wait();
    ph.go.wait();
    let t0 = Instant::now();
    let r = match &mut th {
        Ok(th) => match mode {
            Mode::Batched => pmem_batched(w, th, &mut win, &mut tickets),
            _ => pmem_immediate(w, th, &mut win),
        },
        Err(e) => Err(e.clone()),
    };
    let elapsed = t0.elapsed();
    ph.done.wait();
    ph.snapped.wait();
    // Untimed: free what is still live, so that the next round starts from the same
    // heap state.
    if let Ok(th) = &mut th {
        let mut rest = std::mem::take(&mut tickets);
        for p in win.drain(..) {
            if let Ok(t) = th.prepare_free(p) {
                rest.push(t);
            }
        }
        w.heap.free_tickets(rest).map_err(|e| e.to_string())?;
        th.end_op();
    }
    r.map(|()| elapsed)
}

/// Allocates one block and stores 8 bytes into it (flushed with `--flush-data`).
#[inline]
fn pmem_alloc_one(w: &Work<'_>, th: &mut ThreadHeap, i: u64) -> BenchResult<PPtr<u8>> {
    let p = th.alloc(w.size).map_err(|e| e.to_string())?;
    let region = w.heap.region();
    region.write(p.offset(), &i);
    if w.flush_data {
        region.flush(p.offset(), 8);
    }
    Ok(p)
}

fn pmem_immediate(
    w: &Work<'_>,
    th: &mut ThreadHeap,
    win: &mut VecDeque<PPtr<u8>>,
) -> BenchResult<()> {
    for i in 0..w.ops {
        let p = pmem_alloc_one(w, th, i)?;
        win.push_back(p);
        if win.len() > w.window {
            let old = win.pop_front().expect("window is not empty");
            th.free(old).map_err(|e| e.to_string())?;
        }
        th.end_op();
    }
    Ok(())
}

fn pmem_batched(
    w: &Work<'_>,
    th: &mut ThreadHeap,
    win: &mut VecDeque<PPtr<u8>>,
    tickets: &mut Vec<FreeTicket>,
) -> BenchResult<()> {
    for i in 0..w.ops {
        let p = pmem_alloc_one(w, th, i)?;
        win.push_back(p);
        if win.len() > w.window {
            let old = win.pop_front().expect("window is not empty");
            tickets.push(th.prepare_free(old).map_err(|e| e.to_string())?);
            if tickets.len() >= w.batch {
                w.heap
                    .free_tickets(tickets.drain(..))
                    .map_err(|e| e.to_string())?;
            }
        }
        th.end_op();
    }
    // The frees announced so far are part of the measured work.
    if !tickets.is_empty() {
        w.heap
            .free_tickets(tickets.drain(..))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One thread of a system-allocator round.
fn system_worker(w: &Work<'_>, ph: &Phases) -> BenchResult<Duration> {
    let layout = w.layout;
    let mut win: VecDeque<*mut u8> = VecDeque::with_capacity(w.window + 1);
    ph.ready.wait();
    ph.go.wait();
    let t0 = Instant::now();
    for i in 0..w.ops {
        // SAFETY: `layout` has a nonzero size (at least 8, checked by `run`).
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `p` is a fresh allocation of at least 8 bytes, 16-byte aligned.
        unsafe { std::ptr::write_volatile(p as *mut u64, i) };
        win.push_back(p);
        if win.len() > w.window {
            let old = win.pop_front().expect("window is not empty");
            // SAFETY: `old` came from `alloc(layout)` above and is freed only here.
            unsafe { std::alloc::dealloc(old, layout) };
        }
    }
    let elapsed = t0.elapsed();
    ph.done.wait();
    ph.snapped.wait();
    for p in win.drain(..) {
        // SAFETY: as above: allocated with `layout`, freed once.
        unsafe { std::alloc::dealloc(p, layout) };
    }
    Ok(elapsed)
}
