//! `ember bench persist`: the cost of persisting a 64-byte record under each
//! persistence strategy.
//!
//! For each strategy the CPU supports: a temporary 64 MiB heap using it, one 1 MiB
//! block, and `iters` records written at rotating 64-byte-aligned offsets of that
//! block, each made durable with `Region::persist(off, 64)` (flush + fence). The
//! median over rounds of ns per record is reported, with the fences, flushes and
//! msyncs per record. Strategies the CPU lacks are listed as unsupported.

use super::{delta, median, BenchResult, Machine, TempHeap};
use clap::Args;
use pmem::layout::MIB;
use pmem::{HeapOptions, PersistStats, Strategy};
use serde_json::{json, Value};
use std::time::Instant;

const RECORD: usize = 64;
const BLOCK: u64 = MIB;
const HEAP: u64 = 64 * MIB;

#[derive(Args, Debug)]
pub struct PersistArgs {
    /// Records per round (msync uses iters/1000, at least 200).
    #[arg(long, default_value_t = 100_000)]
    pub iters: u64,
    /// Rounds per strategy (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Emulated extra latency per fence, in ns.
    #[arg(long, default_value_t = 0)]
    pub fence_ns: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

const STRATEGIES: [Strategy; 5] = [
    Strategy::Clwb,
    Strategy::Clflushopt,
    Strategy::Clflush,
    Strategy::FenceOnly,
    Strategy::Msync,
];

struct Outcome {
    strategy: Strategy,
    /// None: the CPU lacks the instruction.
    measured: Option<Measured>,
}

struct Measured {
    iters: u64,
    ns_per_record: f64,
    rounds_ns_per_record: Vec<f64>,
    fences_per_record: f64,
    flushes_per_record: f64,
    msyncs_per_record: f64,
}

/// Records per round for `st`: msync is orders of magnitude slower.
fn iters_for(st: Strategy, iters: u64) -> u64 {
    if st == Strategy::Msync {
        (iters / 1000).max(200).min(iters)
    } else {
        iters
    }
}

pub fn run(args: &PersistArgs) -> BenchResult<()> {
    if args.iters == 0 || args.rounds == 0 {
        return Err("--iters and --rounds must be at least 1".into());
    }
    let machine = Machine::detect();
    let mut out = Vec::new();
    for st in STRATEGIES {
        let measured = if st.supported() {
            Some(measure(st, iters_for(st, args.iters), args)?)
        } else {
            None
        };
        out.push(Outcome {
            strategy: st,
            measured,
        });
    }

    if args.json {
        let list: Vec<Value> = out
            .iter()
            .map(|o| match &o.measured {
                Some(m) => json!({
                    "strategy": o.strategy.name(),
                    "supported": true,
                    "iters": m.iters,
                    "ns_per_record": m.ns_per_record,
                    "rounds_ns_per_record": m.rounds_ns_per_record,
                    "fences_per_record": m.fences_per_record,
                    "flushes_per_record": m.flushes_per_record,
                    "msyncs_per_record": m.msyncs_per_record,
                }),
                None => json!({
                    "strategy": o.strategy.name(),
                    "supported": false,
                }),
            })
            .collect();
        let v = json!({
            "bench": "persist",
            "machine": machine.to_json(),
            "fence_ns": args.fence_ns,
            "threads": 1,
            "auto_strategy": Strategy::detect().name(),
            "iters": args.iters,
            "rounds": args.rounds,
            "record_bytes": RECORD,
            "block_bytes": BLOCK,
            "strategies": list,
        });
        println!("{v}");
    } else {
        println!("ember bench persist: cost of making one 64-byte record durable (store + flush + fence)");
        println!("machine:  {}", machine.line());
        println!(
            "fence_ns: {}   threads: 1   auto strategy: {}",
            args.fence_ns,
            Strategy::detect().name()
        );
        println!(
            "records rotate over a 1 MiB block at 64-byte aligned offsets; median of {} rounds; \
             heaps in {}",
            args.rounds,
            std::env::temp_dir().display()
        );
        println!();
        println!(
            "{:<11} {:>8} {:>14} {:>18} {:>19} {:>18}",
            "strategy",
            "iters",
            "ns_per_record",
            "fences_per_record",
            "flushes_per_record",
            "msyncs_per_record"
        );
        for o in &out {
            match &o.measured {
                Some(m) => println!(
                    "{:<11} {:>8} {:>14.1} {:>18.3} {:>19.3} {:>18.3}",
                    o.strategy.name(),
                    m.iters,
                    m.ns_per_record,
                    m.fences_per_record,
                    m.flushes_per_record,
                    m.msyncs_per_record
                ),
                None => println!(
                    "{:<11} {:>8} unsupported by this CPU",
                    o.strategy.name(),
                    "-"
                ),
            }
        }
    }
    Ok(())
}

fn measure(st: Strategy, iters: u64, args: &PersistArgs) -> BenchResult<Measured> {
    let opts = HeapOptions {
        size: HEAP,
        strategy: st,
        fence_ns: args.fence_ns,
        ..Default::default()
    };
    let tmp = TempHeap::create(None, &format!("-persist-{}", st.name()), &opts)?;
    let heap = &tmp.heap;
    let region = heap.region();
    let mut th = heap.thread().map_err(|e| e.to_string())?;
    let block = th.alloc(BLOCK).map_err(|e| e.to_string())?;
    region.fence();
    th.end_op();
    let base = block.offset();
    let slots = BLOCK / RECORD as u64;
    let mut k = 0u64;
    let mut rec = [0u8; RECORD];
    let mut one = |k: &mut u64| {
        let off = base + (*k % slots) * RECORD as u64;
        rec[..8].copy_from_slice(&k.to_le_bytes());
        region.write_bytes(off, &rec);
        region.persist(off, RECORD);
        *k += 1;
    };
    // Warm-up (not measured): touch every page of the block once.
    for _ in 0..iters.min(slots) {
        one(&mut k);
    }
    let mut ns = Vec::with_capacity(args.rounds);
    let mut per = Vec::with_capacity(args.rounds);
    for _ in 0..args.rounds {
        let s0 = region.persist_stats();
        let t0 = Instant::now();
        for _ in 0..iters {
            one(&mut k);
        }
        let el = t0.elapsed();
        let s1 = region.persist_stats();
        ns.push(el.as_nanos() as f64 / iters as f64);
        per.push(delta(s0, s1));
    }
    let n = iters as f64;
    let med = |f: fn(&PersistStats) -> u64| {
        median(&per.iter().map(|s| f(s) as f64 / n).collect::<Vec<_>>())
    };
    let m = Measured {
        iters,
        ns_per_record: median(&ns),
        fences_per_record: med(|s| s.fences),
        flushes_per_record: med(|s| s.flushes),
        msyncs_per_record: med(|s| s.msyncs),
        rounds_ns_per_record: ns,
    };
    drop(th);
    drop(tmp);
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msync_runs_fewer_iterations() {
        assert_eq!(iters_for(Strategy::Clwb, 100_000), 100_000);
        assert_eq!(iters_for(Strategy::Msync, 100_000), 200);
        assert_eq!(iters_for(Strategy::Msync, 1_000_000), 1000);
        assert_eq!(iters_for(Strategy::Msync, 50), 50);
    }
}
