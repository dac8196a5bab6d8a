//! `ember bench scenario NAME`: the papers' experiments as named scenarios. Each
//! one runs the existing benchmarks as child processes of this binary (`ember
//! bench engine|index|recovery --json`) or starts real servers (`ember serve`,
//! `redis-server`) and drives them (`redis-benchmark`), then writes
//! `DIR/NAME.csv` (one row per measurement, every row labelled with the machine,
//! engine and variant, durability mode, persistence strategy, emulated fence
//! latency, threads and commit) and a chart, `DIR/NAME.svg` and `DIR/NAME.png`.
//!
//! `--quick` makes every scenario small and short (seconds; what CI runs); the
//! figures in BENCHMARKS.md come from full runs. Children run with timeouts and
//! are killed (with their process group) on every way out; SIGINT/SIGTERM stop
//! the scenario the same way.

mod apps;
mod bullet;
mod chart;
mod child;
mod cluster;
mod coll;
mod logfree;
mod mcload;
mod nvmc;
mod progress;
mod resp;
mod respload;
mod serve_recovery;
mod servers;
mod table;
mod udorn;

use super::{BenchResult, Machine};
use chart::Chart;
use clap::Args;
use progress::Progress;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use table::Table;

/// The commit the binary was built from (build.rs; "unknown" without git).
pub const COMMIT: &str = env!("EMBER_COMMIT");

#[derive(Args, Debug)]
pub struct ScenarioArgs {
    /// The scenario (see --list), or `all` for every one in turn.
    pub name: Option<String>,
    /// List the scenarios, one line each.
    #[arg(long)]
    pub list: bool,
    /// Small and short (seconds per scenario), as CI runs them.
    #[arg(long)]
    pub quick: bool,
    /// Output directory [default: bench-out/NAME]; with `all`, one directory
    /// per scenario under it.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Emulated extra latency per persistence fence, in ns, for every benchmark
    /// and server that has the knob; labelled as emulation in rows and charts.
    #[arg(long, default_value_t = 0)]
    pub fence_ns: u64,
    /// Emulated extra latency per node the heap's index structures read (the
    /// backend of direct and Bullet), in ns, for the engine and index
    /// benchmarks: with --fence-ns, the papers' "persistent memory is slower
    /// than DRAM" setting (e.g. the Bullet paper's 2x DRAM latency); labelled
    /// as emulation in rows and charts.
    #[arg(long, default_value_t = 0)]
    pub read_ns: u64,
    /// Persistence strategy of the engine and index benchmarks (auto, clwb,
    /// clflushopt, clflush, fence-only or msync).
    #[arg(long, default_value = "auto")]
    pub strategy: String,
    /// Most threads: scenarios run 1..=N threads, or 1 and N.
    #[arg(long, default_value_t = 2)]
    pub max_threads: usize,
    /// The `ember` binary whose `ember serve` the server scenarios (udorn-*,
    /// serve-recovery) measure [default: the `ember` next to this program].
    #[arg(long, value_name = "PATH")]
    pub ember: Option<PathBuf>,
    /// Rounds of the scenarios that alternate servers (udorn-fig4, udorn-fig5,
    /// udorn-sustained, udorn-coll-restart, serve-recovery) [default: each
    /// scenario's own, 1 with --quick].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: Option<u32>,
    /// udorn-coll-restart: elements of the sorted set whose restart is timed
    /// [default: 1000000; 20000 with --quick].
    #[arg(long, value_name = "N")]
    pub zset_elements: Option<u64>,
    /// udorn-coll-restart: elements of the list whose restart is timed
    /// [default: 1000000; 20000 with --quick].
    #[arg(long, value_name = "N")]
    pub list_elements: Option<u64>,
    /// logfree-fig11: measure the warm-up instead of throughput: memcached
    /// repopulated from the client against Ember restarted after SIGKILL, at
    /// 1 M and 10 M items, and memory per item.
    #[arg(long)]
    pub warmup: bool,
    /// logfree-fig11: client threads of the load generator (it shares the
    /// cores with the server, so 1 or 2).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=2))]
    pub client_threads: u32,
    /// logfree-fig11: connections per client thread.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub conns: u32,
    /// logfree-fig11: requests in flight per connection (pipelining depth).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub pipeline: u32,
    /// logfree-fig11: keys per `get` (1: single-key gets; more: multi-get).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub multiget: u32,
    /// logfree-fig11: seconds of each measured window (after 2 s of warm-up).
    #[arg(long, value_name = "S", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub seconds: u64,
    /// logfree-fig11: also run `memcaslap` (Debian libmemcached-tools) on each
    /// server after the bench's own generator, as a cross-check (its keys are
    /// its own: it gets only keys it has set).
    #[arg(long)]
    pub memcaslap: bool,
}

/// The memcached load generator's knobs (`logfree-fig11`).
#[derive(Clone, Debug)]
pub struct McKnobs {
    pub warmup: bool,
    pub client_threads: usize,
    pub conns: usize,
    pub pipeline: usize,
    pub multiget: usize,
    pub seconds: u64,
    pub memcaslap: bool,
}

/// What a scenario produces: its rows and its chart.
pub struct Report {
    pub table: Table,
    pub chart: Chart,
}

struct Scenario {
    name: &'static str,
    about: &'static str,
    run: fn(&mut Ctx) -> BenchResult<Report>,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "bullet-fig5",
        about: "Bullet Fig. 5: p99 latency against throughput of volatile, direct (phash, logfree) and bullet-st/lfr/opt/dyn/full at 0/2/15/50% puts, 1..N threads",
        run: bullet::fig5,
    },
    Scenario {
        name: "bullet-fig6",
        about: "Bullet Fig. 6: latency CDFs of gets and puts of every store at 2% puts, N threads",
        run: bullet::fig6,
    },
    Scenario {
        name: "bullet-fig7",
        about: "Bullet Fig. 7: throughput and gleaner count per second of bullet-full while puts step 2-15-2-0-2-50-2%",
        run: bullet::fig7,
    },
    Scenario {
        name: "bullet-fig8",
        about: "Bullet Fig. 8: throughput of bullet-full against log size 1/4/16/64 MiB at 2% puts",
        run: bullet::fig8,
    },
    Scenario {
        name: "logfree-fig5",
        about: "Log-free Fig. 5: update throughput against structure size, log-free against the redo-log baseline, 1 and N threads",
        run: logfree::fig5,
    },
    Scenario {
        name: "logfree-fig8",
        about: "Log-free Fig. 8: update throughput of logfree (link cache), logfree-nocache and redo by structure, 1 and N threads",
        run: logfree::fig8,
    },
    Scenario {
        name: "logfree-fig10",
        about: "Log-free Fig. 10: recovery time after a SIGKILL against structure size",
        run: logfree::fig10,
    },
    Scenario {
        name: "logfree-fig11",
        about: "Log-free Fig. 11 (NV-Memcached): 1:4 set:get throughput over key ranges, ember serve --memcached-port (pmem, msync) against memcached 1.6, own load generator; --warmup: memcached repopulation against Ember's restart after SIGKILL at 1M/10M items, and memory per item",
        run: nvmc::fig11,
    },
    Scenario {
        name: "udorn-fig4",
        about: "UDORN Fig. 4: launch and shutdown time against keys, ember serve against redis-server loading RDB and AOF",
        run: udorn::fig4,
    },
    Scenario {
        name: "udorn-fig5",
        about: "UDORN Fig. 5/6: redis-benchmark SET/GET/INCR and the collection workloads (LPUSH ... ZPOPMIN, LRANGE_100/300/600, MSET) at -P 1 and 16, Ember (pmem, msync) against redis-server (AOF everysec, always)",
        run: udorn::fig5,
    },
    Scenario {
        name: "udorn-sustained",
        about: "Sustained writes: redis-benchmark SET -P 16 long enough to fill Bullet's logs, Ember (pmem, msync) against redis-server (AOF everysec, always): throughput, p99 and max latency",
        run: udorn::sustained,
    },
    Scenario {
        name: "udorn-coll-restart",
        about: "Large collections: time from process start to the first answered ZRANGE/LINDEX on a big sorted set and list after SHUTDOWN and SIGKILL (redis-server: RDB load), and bytes per element of lists, hashes, sets and sorted sets at 1,000 and 1,000,000 elements, Ember against redis-server",
        run: coll::run,
    },
    Scenario {
        name: "serve-recovery",
        about: "ember serve: restart time after SIGKILL under a SET load against MB of Bullet log read at recovery, 8 logs of 1/4/16/64 MiB",
        run: serve_recovery::run,
    },
    Scenario {
        name: "scripts-txn-pubsub",
        about: "What Redis applications call: EVAL and EVALSHA (redis-benchmark), MULTI/EXEC and PUBLISH fan-out to 50 subscribers (own load generator) at -P 1 and 16, Ember (pmem) against redis-server (AOF everysec); --strategy msync: Ember msync against AOF always",
        run: apps::run,
    },
    Scenario {
        name: "cluster",
        about: "Replication: SET/INCR/LPUSH from 50 clients on a 3-node Ember cluster (pmem; msync with --strategy msync, then also against etcd if installed) against Redis + 2 replicas with WAIT 2 0, Ember --threads 1 and N; failover time after SIGKILL of the leader, Ember against Redis Sentinel",
        run: cluster::run,
    },
    Scenario {
        name: "cluster-apply",
        about: "Replication: serial against parallel apply (--raft-apply-lanes 1 and 2): SET from 50 clients with a follower down, then the follower's catch-up rate (entries applied per second)",
        run: cluster::run_apply,
    },
];

/// Everything a scenario needs: the options, the machine, where to write, and
/// the progress display.
pub struct Ctx {
    pub name: &'static str,
    pub quick: bool,
    pub fence_ns: u64,
    pub read_ns: u64,
    pub strategy: String,
    pub max_threads: usize,
    /// `--rounds`: overrides a scenario's round count.
    rounds: Option<u32>,
    /// `--zset-elements` and `--list-elements` (udorn-coll-restart).
    pub zset_elements: Option<u64>,
    pub list_elements: Option<u64>,
    /// The memcached load generator's knobs (logfree-fig11).
    pub mc: McKnobs,
    pub machine: Machine,
    /// This program: the benchmarks run as its children.
    pub exe: PathBuf,
    /// The `ember` binary the server scenarios start (`ember serve`); checked
    /// when a scenario asks for it ([`Ctx::ember`]).
    ember: PathBuf,
    pub progress: Progress,
    stop: Arc<AtomicBool>,
    /// Scratch space of the benchmarks' heap files: removed with everything in
    /// it when the scenario ends, also when a child was killed.
    work: child::TempDir,
}

impl Ctx {
    /// `quick` or `full`.
    pub fn mode(&self) -> &'static str {
        if self.quick {
            "quick"
        } else {
            "full"
        }
    }

    /// The rounds of a scenario whose full run has `full` rounds: 1 in quick
    /// mode, unless `--rounds` says otherwise.
    pub fn rounds(&self, full: usize) -> usize {
        match self.rounds {
            Some(n) => n as usize,
            None if self.quick => 1,
            None => full,
        }
    }

    /// Fails once SIGINT or SIGTERM arrived.
    pub fn check_stop(&self) -> BenchResult<()> {
        if self.stop.load(Ordering::Relaxed) {
            Err("interrupted".into())
        } else {
            Ok(())
        }
    }

    pub fn stop_flag(&self) -> &AtomicBool {
        &self.stop
    }

    /// The `ember` binary to start servers from: a scenario that runs
    /// `ember serve` fails here, with how to get it, when there is none.
    pub fn ember(&self) -> BenchResult<PathBuf> {
        if self.ember.is_file() {
            Ok(self.ember.clone())
        } else {
            Err(format!(
                "no ember binary at {}: this scenario measures `ember serve`; build it \
                 (cargo build --release -p ember) or name it with --ember PATH",
                self.ember.display()
            ))
        }
    }

    /// The scenario's scratch directory (for `--heap` and `--dir` of the benches).
    pub fn work_dir(&self) -> &Path {
        self.work.path()
    }

    /// Thread counts 1..=max_threads.
    pub fn thread_range(&self) -> Vec<usize> {
        (1..=self.max_threads).collect()
    }

    /// 1 and max_threads (once when they are equal).
    pub fn thread_ends(&self) -> Vec<usize> {
        let mut v = vec![1, self.max_threads];
        v.dedup();
        v
    }

    /// Runs `ember bench ARGS --json` (this program with ARGS) and returns its
    /// (last) JSON object.
    pub fn bench(&self, args: &[String], timeout: Duration) -> BenchResult<Value> {
        self.check_stop()?;
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.args(args).arg("--json");
        let what = format!("ember bench {}", args.join(" "));
        let out = child::run_capture(cmd, &what, timeout, &self.stop)?;
        let line = out
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .ok_or_else(|| format!("{what}: printed no JSON object: {out:?}"))?;
        serde_json::from_str(line).map_err(|e| format!("{what}: bad JSON ({e}): {line}"))
    }

    /// The chart's second line: machine, durability, emulation, commit, mode.
    pub fn subtitle(&self, durability: &str) -> String {
        format!(
            "{}, {} cores · {durability} · {} · commit {COMMIT} · {} run",
            self.machine.cpu,
            self.machine.cores,
            emulation(self.fence_ns, self.read_ns),
            self.mode()
        )
    }
}

/// How a row or chart names the emulation knobs.
pub fn emulation(fence_ns: u64, read_ns: u64) -> String {
    match (fence_ns, read_ns) {
        (0, 0) => "no emulation (fence_ns 0, read_ns 0)".into(),
        (f, 0) => format!("emulated fence {f} ns"),
        (0, r) => format!("emulated node read {r} ns"),
        (f, r) => format!("emulated fence {f} ns, node read {r} ns"),
    }
}

/// A number of a bench's JSON output.
pub fn num(v: &Value, key: &str) -> BenchResult<f64> {
    v.get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("no number {key:?} in {v}"))
}

/// A number of a bench's JSON output, or "" when absent or null.
pub fn opt_num(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_f64)
        .map(|x| x.to_string())
        .unwrap_or_default()
}

/// A string of a bench's JSON output.
pub fn text(v: &Value, key: &str) -> BenchResult<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("no string {key:?} in {v}"))
}

/// The median of the values (`NaN` when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        super::median(v)
    }
}

fn list() {
    let w = SCENARIOS.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in SCENARIOS {
        println!("{:w$}  {}", s.name, s.about);
    }
}

/// Sets `stop` on SIGINT, SIGTERM and SIGHUP, so that the scenario ends through
/// its guards (children killed, temporary files removed); a second SIGINT or
/// SIGTERM exits at once.
fn stop_on_signals() -> BenchResult<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM, SIGHUP] {
        signal_hook::flag::register_conditional_shutdown(sig, 1, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()))
            .map_err(|e| format!("cannot handle signal {sig}: {e}"))?;
    }
    Ok(stop)
}

pub fn run(args: &ScenarioArgs) -> BenchResult<()> {
    if args.list {
        list();
        return Ok(());
    }
    let Some(name) = args.name.as_deref() else {
        return Err("name a scenario (ember bench scenario --list shows them) or all".into());
    };
    if args.max_threads == 0 || args.max_threads > 256 {
        return Err(format!(
            "--max-threads {} must be in 1..=256",
            args.max_threads
        ));
    }
    pmem::Strategy::parse(&args.strategy).map_err(|e| e.to_string())?;
    let chosen: Vec<&Scenario> = if name == "all" {
        SCENARIOS.iter().collect()
    } else {
        match SCENARIOS.iter().find(|s| s.name == name) {
            Some(s) => vec![s],
            None => {
                let names: Vec<_> = SCENARIOS.iter().map(|s| s.name).collect();
                return Err(format!(
                    "unknown scenario {name:?} (one of {}, or all)",
                    names.join(", ")
                ));
            }
        }
    };
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let ember = match &args.ember {
        Some(p) => p.clone(),
        None => exe.with_file_name("ember"),
    };
    let stop = stop_on_signals()?;
    let machine = Machine::detect();
    let mut failed = Vec::new();
    for s in &chosen {
        let dir = match (&args.out, name == "all") {
            (Some(d), true) => d.join(s.name),
            (Some(d), false) => d.clone(),
            (None, _) => PathBuf::from("bench-out").join(s.name),
        };
        let mut ctx = Ctx {
            name: s.name,
            quick: args.quick,
            fence_ns: args.fence_ns,
            read_ns: args.read_ns,
            strategy: args.strategy.clone(),
            max_threads: args.max_threads,
            rounds: args.rounds,
            zset_elements: args.zset_elements,
            list_elements: args.list_elements,
            mc: McKnobs {
                warmup: args.warmup,
                client_threads: args.client_threads as usize,
                conns: args.conns as usize,
                pipeline: args.pipeline as usize,
                multiget: args.multiget as usize,
                seconds: args.seconds,
                memcaslap: args.memcaslap,
            },
            machine: machine.clone(),
            exe: exe.clone(),
            ember: ember.clone(),
            progress: Progress::new(s.name),
            stop: stop.clone(),
            work: child::TempDir::for_scenario(s.name)?,
        };
        if let Err(e) = run_one(s, &mut ctx, &dir) {
            ctx.progress.abandon();
            eprintln!("ember bench scenario {}: {e}", s.name);
            if stop.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            failed.push(s.name);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("failed: {}", failed.join(", ")))
    }
}

fn run_one(s: &Scenario, ctx: &mut Ctx, dir: &Path) -> BenchResult<()> {
    let t = Instant::now();
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let report = (s.run)(ctx)?;
    ctx.progress.finish();
    if report.table.is_empty() {
        return Err("no results".into());
    }
    let csv = dir.join(format!("{}.csv", s.name));
    report.table.write(&csv)?;
    let (svg, png) = chart::write(&report.chart, dir, s.name)?;
    println!(
        "{}: {} rows in {} ({:.1} s); chart {} and {}",
        s.name,
        report.table.len(),
        csv.display(),
        t.elapsed().as_secs_f64(),
        svg.display(),
        png.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_listed() {
        let mut names: Vec<_> = SCENARIOS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SCENARIOS.len());
        assert!(!names.contains(&"all"));
    }

    #[test]
    fn emulation_is_named() {
        assert!(emulation(0, 0).contains("no emulation"));
        assert_eq!(emulation(100, 0), "emulated fence 100 ns");
        assert_eq!(emulation(0, 60), "emulated node read 60 ns");
        assert_eq!(emulation(100, 60), "emulated fence 100 ns, node read 60 ns");
    }
}
