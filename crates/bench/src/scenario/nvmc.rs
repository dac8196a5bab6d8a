//! NV-Memcached (log-free paper §6.5, Figure 11) against a real `memcached`
//! 1.6, with our own load generator ([`super::mcload`]).
//!
//! Throughput (`logfree-fig11`): for each key range, the paper's workload —
//! the cache first filled with half of the key range, then `set` and `get`
//! at 1:4 on keys drawn uniformly from the range, values of 32 bytes
//! (memtier-benchmark's default; the paper used memtier) — against
//! `memcached -t CORES` and `ember serve --memcached-port` in the default
//! durability (pmem) and msync, servers alternating A B C A B C, a fresh
//! server for every run. Throughput, p50/p99, and Ember/memcached as the
//! ratio of the medians. The load generator shares the machine's cores with
//! the server, so it runs 1-2 client threads (said in the output).
//!
//! Warm-up (`logfree-fig11 --warmup`), at 1 M and 10 M items: memcached's
//! time to be repopulated (a fresh server filled from the client at full
//! speed until every key is present: start plus fill) against Ember's
//! restart after SIGKILL with the same items (from the process's start to a
//! `get` of a stored key that hits). Every key is checked present afterwards
//! on both. Memory per item: memcached's `stats` bytes / curr_items and its
//! RSS growth per item, Ember's growth of INFO used_memory per item (its
//! used_memory starts at the heap's base, some 300 MB, and grows by whole
//! chunks, so the figure means something at 1 M items and more, not at the
//! quick run's thousands; used_memory and DBSIZE are in the row too) and its
//! RSS growth per item.
//!
//! Without `--memcached-port` in `ember serve --help` (or when the port
//! refuses), Ember's half is skipped and the output says so; memcached's
//! half still runs.

use super::chart::{Bars, Chart, Lines, Panel, Series};
use super::child::{run_capture, Guard, TempDir};
use super::mcload::{self, Known, Load};
use super::servers::{free_port, Kind, Server};
use super::table::{Labels, Table};
use super::udorn::{labels_of, server_spec};
use super::{median, BenchResult, Ctx, Report};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The paper's memtier default value size.
const VALUE_SIZE: usize = 32;
/// 1 set to 4 gets.
const SET_RATIO: f64 = 0.2;

/// The servers of a throughput round, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Srv {
    Memcached,
    Ember { msync: bool },
}

impl Srv {
    fn label(self) -> &'static str {
        match self {
            Srv::Memcached => "memcached",
            Srv::Ember { msync: false } => "ember pmem",
            Srv::Ember { msync: true } => "ember msync",
        }
    }

    fn kind(self) -> Option<Kind> {
        match self {
            Srv::Memcached => None,
            Srv::Ember { msync } => Some(Kind::Ember { msync }),
        }
    }
}

/// `memcached -V`'s version.
fn memcached_version(ctx: &Ctx) -> BenchResult<String> {
    let mut c = Command::new("memcached");
    c.arg("-V");
    let out = run_capture(c, "memcached -V", Duration::from_secs(10), ctx.stop_flag())?;
    Ok(out
        .split_whitespace()
        .nth(1)
        .unwrap_or("unknown")
        .to_string())
}

/// Whether `ember serve` has the memcached port (its --help names it).
fn ember_serves_memcached(ctx: &Ctx) -> BenchResult<bool> {
    let mut c = Command::new(ctx.ember()?);
    c.args(["serve", "--help"]);
    let out = run_capture(
        c,
        "ember serve --help",
        Duration::from_secs(10),
        ctx.stop_flag(),
    )?;
    Ok(out.contains("--memcached-port"))
}

/// What the output says when Ember's half is not measured.
const NO_EMBER: &str = "Ember: not measured: `ember serve` does not serve memcached yet \
     (no --memcached-port); memcached's half only";

/// A running `memcached`; dropping it kills it.
struct Memcached {
    guard: Guard,
    port: u16,
}

impl Memcached {
    /// Starts `memcached -p PORT -U 0 -l 127.0.0.1 -m MIB -t THREADS` (and
    /// `-u root` when running as root, which memcached otherwise refuses)
    /// and waits until `version` answers.
    fn start(ctx: &Ctx, mib: u64, threads: usize) -> BenchResult<(Memcached, Duration)> {
        let port = free_port()?;
        let mut c = Command::new("memcached");
        c.args(["-p", &port.to_string(), "-U", "0", "-l", "127.0.0.1"])
            .args(["-m", &mib.to_string(), "-t", &threads.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: geteuid(2) has no preconditions.
        #[allow(unsafe_code)]
        if unsafe { libc::geteuid() } == 0 {
            c.args(["-u", "root"]);
        }
        let t0 = Instant::now();
        let mut guard = Guard::spawn(c, &format!("memcached on port {port}"))?;
        let deadline = t0 + Duration::from_secs(30);
        loop {
            if let Some(st) = guard.try_wait()? {
                return Err(format!("memcached exited at start ({st})"));
            }
            if let Ok(l) = mcload::command(port, "version", false) {
                if l.first().is_some_and(|l| l.starts_with("VERSION")) {
                    break;
                }
            }
            ctx.check_stop()?;
            if Instant::now() >= deadline {
                return Err("memcached did not answer `version` within 30 s".into());
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        Ok((Memcached { guard, port }, t0.elapsed()))
    }

    fn rss(&self) -> u64 {
        rss_of(self.guard.id())
    }
}

/// A process's resident set (VmRSS), bytes; 0 when unreadable.
fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// memcached's memory limit for `items` items (MiB): far more than they
/// take, so that nothing is evicted (an eviction would count as a loss).
fn memcached_mib(items: u64) -> u64 {
    (items.saturating_mul(256) >> 20).saturating_add(256)
}

/// Ember's heap for `items` items (MiB; a sparse file).
fn ember_heap_mib(items: u64) -> u64 {
    (items.saturating_mul(600) >> 20)
        .saturating_add(256)
        .max(1024)
}

/// A running server of either kind, with its memcached port and row labels.
/// The fields drop in order: the server is killed before its directory goes.
struct Running {
    mc: Option<Memcached>,
    ember: Option<Server>,
    port: u16,
    /// From the spawn to the first answer.
    launch: Duration,
    lab: Labels,
    _dir: Option<TempDir>,
}

/// The labels of memcached's rows.
fn memcached_labels(version: &str, threads: usize) -> Labels {
    Labels {
        engine: "memcached".into(),
        variant: version.into(),
        durability: "volatile".into(),
        strategy: "none".into(),
        fence_ns: 0,
        read_ns: 0,
        threads,
    }
}

/// Starts `srv` able to hold `items` items. Ember: None when its memcached
/// port refuses (it does not serve memcached).
fn start(
    ctx: &Ctx,
    srv: Srv,
    items: u64,
    tag: &str,
    version: &str,
) -> BenchResult<Option<Running>> {
    let threads = ctx.machine.cores;
    match srv.kind() {
        None => {
            let (m, launch) = Memcached::start(ctx, memcached_mib(items), threads)?;
            Ok(Some(Running {
                port: m.port,
                launch,
                mc: Some(m),
                ember: None,
                lab: memcached_labels(version, threads),
                _dir: None,
            }))
        }
        Some(kind) => {
            let dir = TempDir::new_in(ctx.work_dir(), tag)?;
            let ember = ctx.ember()?;
            let mc_port = free_port()?;
            let mut spec = server_spec(ctx, kind, dir.path(), &ember, ember_heap_mib(items));
            spec.extra = vec!["--memcached-port".into(), mc_port.to_string()];
            let (s, launch) = spec.start(Duration::from_secs(60), ctx.stop_flag())?;
            // Ready for RESP (PING); the memcached listener gets 2 s more.
            let deadline = Instant::now() + Duration::from_secs(2);
            while !mcload::command(mc_port, "version", false)
                .is_ok_and(|l| l.first().is_some_and(|l| l.starts_with("VERSION")))
            {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                ctx.check_stop()?;
                std::thread::sleep(Duration::from_millis(10));
            }
            let lab = labels_of(ctx, kind, &s)?;
            Ok(Some(Running {
                mc: None,
                ember: Some(s),
                port: mc_port,
                launch,
                lab,
                _dir: Some(dir),
            }))
        }
    }
}

/// memcached's version, and the servers of a round: memcached, then `embers`
/// when `ember serve` has the memcached port (the output says so when not).
fn servers(ctx: &Ctx, embers: &[Srv]) -> BenchResult<(String, Vec<Srv>)> {
    let version = memcached_version(ctx)?;
    let mut srvs = vec![Srv::Memcached];
    if ember_serves_memcached(ctx)? {
        srvs.extend_from_slice(embers);
    } else {
        ctx.progress.note(NO_EMBER);
    }
    Ok((version, srvs))
}

/// Starts the next server of a round, with its progress line (`what`; `tag`
/// names its directory); None to skip it: an Ember once Ember was found not
/// to serve memcached (its port refused: `ember_missing` is set then).
fn next_server(
    ctx: &mut Ctx,
    srv: Srv,
    items: u64,
    what: &str,
    tag: &str,
    version: &str,
    ember_missing: &mut bool,
) -> BenchResult<Option<Running>> {
    if *ember_missing && srv != Srv::Memcached {
        return Ok(None);
    }
    ctx.progress.start(format!("{}, {what}", srv.label()));
    let tag = format!("{}-{tag}", srv.label().replace(' ', "-"));
    let server = start(ctx, srv, items, &tag, version)?;
    if server.is_none() {
        *ember_missing = true;
        ctx.progress.note(NO_EMBER);
        ctx.progress.done("skipped: the memcached port refuses");
    }
    Ok(server)
}

/// The scenario's knobs, as the output states them.
fn knobs(ctx: &Ctx) -> String {
    let k = &ctx.mc;
    format!(
        "{} client thread(s) sharing the {} cores with the server, {} connections each, pipeline {}, {} key(s) per get, {VALUE_SIZE}-byte values, 1:4 set:get, uniform keys, half the range stored first",
        k.client_threads, ctx.machine.cores, k.conns, k.pipeline, k.multiget
    )
}

pub fn fig11(ctx: &mut Ctx) -> BenchResult<Report> {
    if ctx.mc.warmup {
        return warmup(ctx);
    }
    let ranges: &[u64] = if ctx.quick {
        &[1_000, 10_000]
    } else {
        &[10_000, 100_000, 1_000_000]
    };
    let (warm, measure) = if ctx.quick {
        (Duration::from_millis(200), Duration::from_millis(500))
    } else {
        (Duration::from_secs(2), Duration::from_secs(ctx.mc.seconds))
    };
    let rounds = ctx.rounds(3);
    let (version, srvs) = servers(
        ctx,
        &[Srv::Ember { msync: false }, Srv::Ember { msync: true }],
    )?;
    let with_ember = srvs.len() > 1;
    ctx.progress
        .plan((ranges.len() * rounds * srvs.len()) as u64);
    let mut table = Table::new(
        ctx,
        &[
            "key_range",
            "round",
            "client_threads",
            "conns_per_thread",
            "pipeline",
            "multiget",
            "value_size",
            "set_ratio",
            "prepopulated",
            "warmup_s",
            "measure_s",
            "requests",
            "ops_per_sec",
            "hit_ratio",
            "p50_us",
            "p99_us",
            "max_us",
            "errors_lost",
            "errors_corrupt",
            "errors_unexpected",
            "ratio_vs_memcached",
            "memcaslap_ops_per_sec",
            "memcaslap_get_misses",
            "memcaslap_ratio_vs_memcached",
            "server_version",
        ],
    );
    // (range, server) -> (ops/s, p50, p99, memcaslap ops/s) of every valid round.
    let mut got: Vec<Vec<[Vec<f64>; 4]>> = vec![vec![Default::default(); srvs.len()]; ranges.len()];
    let mut labels: Vec<Option<Labels>> = vec![None; srvs.len()];
    let mut invalid: Vec<String> = Vec::new();
    let mut ember_missing = !with_ember;
    for (ri, &range) in ranges.iter().enumerate() {
        for round in 1..=rounds {
            for (si, &srv) in srvs.iter().enumerate() {
                let what = format!("key range {range}, round {round}");
                let tag = format!("{range}-{round}");
                let Some(server) =
                    next_server(ctx, srv, range, &what, &tag, &version, &mut ember_missing)?
                else {
                    continue;
                };
                let known = Known::new(range);
                let half = range / 2;
                let (_, perr) = mcload::populate(
                    server.port,
                    0..half,
                    VALUE_SIZE,
                    ctx.mc.client_threads,
                    100,
                    &known,
                    ctx.stop_flag(),
                )
                .map_err(|e| format!("{}: populating: {e}", srv.label()))?;
                let load = Load {
                    port: server.port,
                    threads: ctx.mc.client_threads,
                    conns: ctx.mc.conns,
                    depth: ctx.mc.pipeline,
                    multiget: ctx.mc.multiget,
                    key_range: range,
                    value_size: VALUE_SIZE,
                    set_ratio: SET_RATIO,
                    warmup: warm,
                    measure,
                    seed: 0x5eed ^ (round as u64) << 32 ^ range,
                };
                let mut o = mcload::run(&load, &known, ctx.stop_flag())
                    .map_err(|e| format!("{}: {e}", srv.label()))?;
                o.errors.unexpected += perr.unexpected;
                let e = o.errors;
                let slap = if ctx.mc.memcaslap {
                    Some(memcaslap(ctx, server.port, range, measure)?)
                } else {
                    None
                };
                table.push(
                    &server.lab,
                    vec![
                        range.to_string(),
                        round.to_string(),
                        load.threads.to_string(),
                        load.conns.to_string(),
                        load.depth.to_string(),
                        load.multiget.to_string(),
                        VALUE_SIZE.to_string(),
                        SET_RATIO.to_string(),
                        half.to_string(),
                        format!("{:.1}", warm.as_secs_f64()),
                        format!("{:.1}", measure.as_secs_f64()),
                        o.requests.to_string(),
                        format!("{:.0}", o.ops_per_sec()),
                        format!("{:.4}", o.hit_ratio()),
                        format!("{:.1}", o.p50_us),
                        format!("{:.1}", o.p99_us),
                        format!("{:.1}", o.max_us),
                        e.lost.to_string(),
                        e.corrupt.to_string(),
                        e.unexpected.to_string(),
                        String::new(),
                        slap.map(|(t, _)| format!("{t:.0}")).unwrap_or_default(),
                        slap.map(|(_, m)| m.to_string()).unwrap_or_default(),
                        String::new(),
                        server_version(srv, &version),
                    ],
                );
                if let Some((t, _)) = slap {
                    got[ri][si][3].push(t);
                }
                labels[si] = Some(server.lab.clone());
                drop(server);
                if e.total() == 0 {
                    got[ri][si][0].push(o.ops_per_sec());
                    got[ri][si][1].push(o.p50_us);
                    got[ri][si][2].push(o.p99_us);
                    ctx.progress.done(&format!(
                        "{:.0}k ops/s, p50 {:.0} us, p99 {:.0} us, hits {:.0}%",
                        o.ops_per_sec() / 1e3,
                        o.p50_us,
                        o.p99_us,
                        o.hit_ratio() * 100.0
                    ));
                } else {
                    let msg = format!(
                        "{} at key range {range}, round {round}: INVALID, verification errors: {} lost, {} corrupt, {} unexpected replies",
                        srv.label(),
                        e.lost,
                        e.corrupt,
                        e.unexpected
                    );
                    ctx.progress.done(&msg);
                    invalid.push(msg);
                }
            }
        }
    }
    // The median rows, with Ember/memcached.
    let mut summary = Vec::new();
    for (ri, &range) in ranges.iter().enumerate() {
        let mc = median(&got[ri][0][0]);
        for (si, &srv) in srvs.iter().enumerate() {
            let (Some(lab), false) = (&labels[si], got[ri][si][0].is_empty()) else {
                continue;
            };
            let [ops, p50, p99, slap] = &got[ri][si];
            let ratio = match srv {
                Srv::Memcached => String::new(),
                _ if mc.is_nan() => String::new(),
                _ => format!("{:.3}", median(ops) / mc),
            };
            let slap_mc = median(&got[ri][0][3]);
            let slap_ratio = match srv {
                Srv::Memcached => String::new(),
                _ if slap_mc.is_nan() || slap.is_empty() => String::new(),
                _ => format!("{:.3}", median(slap) / slap_mc),
            };
            table.push(
                lab,
                vec![
                    range.to_string(),
                    "median".into(),
                    ctx.mc.client_threads.to_string(),
                    ctx.mc.conns.to_string(),
                    ctx.mc.pipeline.to_string(),
                    ctx.mc.multiget.to_string(),
                    VALUE_SIZE.to_string(),
                    SET_RATIO.to_string(),
                    (range / 2).to_string(),
                    format!("{:.1}", warm.as_secs_f64()),
                    format!("{:.1}", measure.as_secs_f64()),
                    String::new(),
                    format!("{:.0}", median(ops)),
                    String::new(),
                    format!("{:.1}", median(p50)),
                    format!("{:.1}", median(p99)),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    ratio.clone(),
                    if slap.is_empty() {
                        String::new()
                    } else {
                        format!("{:.0}", median(slap))
                    },
                    String::new(),
                    slap_ratio,
                    server_version(srv, &version),
                ],
            );
            summary.push(format!(
                "| {range:>9} | {:<11} | {:>4} | {:>11.0} | {:>9} | {:>7.1} | {:>7.1} |{}",
                srv.label(),
                ops.len(),
                median(ops),
                if ratio.is_empty() {
                    "-".into()
                } else {
                    format!("{ratio}x")
                },
                median(p50),
                median(p99),
                if ctx.mc.memcaslap {
                    format!(" {:>11.0} |", median(slap))
                } else {
                    String::new()
                }
            ));
        }
    }
    let ember_note = ember_durability_note(&labels, &srvs);
    println!(
        "\nlogfree-fig11: memcached {version} against ember serve --memcached-port (medians of {rounds} round(s), valid runs only)\n\
         machine: {}\nmode: {} run, commit {}\nknobs: {}\n{}\n\
         | key range | server      | runs | requests/s  | ember/mc  | p50 us  | p99 us  |{}\n\
         |-----------|-------------|------|-------------|-----------|---------|---------|{}\n{}",
        ctx.machine.line(),
        ctx.mode(),
        super::COMMIT,
        knobs(ctx),
        if ember_missing { NO_EMBER.to_string() } else { ember_note.clone() },
        if ctx.mc.memcaslap { " memcaslap/s |" } else { "" },
        if ctx.mc.memcaslap { "-------------|" } else { "" },
        summary.join("\n")
    );
    for m in &invalid {
        println!("{m}");
    }
    let groups: Vec<String> = ranges.iter().map(|r| format!("{r} keys")).collect();
    let panel = |i: usize, title: &str, y: &str| {
        Panel::Bars(Bars {
            title: title.into(),
            y_label: y.into(),
            groups: groups.clone(),
            series: srvs
                .iter()
                .enumerate()
                .filter(|(si, _)| labels[*si].is_some())
                .map(|(si, s)| {
                    let vals = got
                        .iter()
                        .map(|per| (!per[si][i].is_empty()).then(|| median(&per[si][i])))
                        .collect();
                    (s.label().to_string(), vals)
                })
                .collect(),
        })
    };
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "logfree-fig11: 1:4 set:get by key range, Ember against memcached {version} (log-free Fig. 11; median of {rounds})"
            ),
            subtitle: ctx.subtitle(&format!(
                "{}; {} client thread(s) on the same cores, {}x{} conns, pipeline {}, multiget {}",
                if ember_missing {
                    "Ember not measured (no --memcached-port)".to_string()
                } else {
                    ember_note
                },
                ctx.mc.client_threads,
                ctx.mc.client_threads,
                ctx.mc.conns,
                ctx.mc.pipeline,
                ctx.mc.multiget
            )),
            panels: vec![
                panel(0, "throughput (requests per second)", "requests per second"),
                panel(2, "p99 latency", "us"),
            ],
        },
    })
}

/// Runs `memcaslap` (libmemcached-tools) against `port` for `measure` with
/// 1 set to 4 gets, 16-byte keys (its shortest) and 32-byte values, the
/// same client threads and connections, and a key window of about `range`
/// keys (at least 1,000 a connection: memcaslap counts it in thousands);
/// returns its TPS and get misses.
fn memcaslap(ctx: &Ctx, port: u16, range: u64, measure: Duration) -> BenchResult<(f64, u64)> {
    let cfg = ctx.work_dir().join("memcaslap.cfg");
    std::fs::write(
        &cfg,
        format!(
            "key\n16 16 1\nvalue\n{VALUE_SIZE} {VALUE_SIZE} 1\ncmd\n0 {SET_RATIO}\n1 {}\n",
            1.0 - SET_RATIO
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", cfg.display()))?;
    let conc = (ctx.mc.client_threads * ctx.mc.conns) as u64;
    let mut c = Command::new("memcaslap");
    c.arg(format!("--servers=127.0.0.1:{port}"))
        .arg(format!("--time={}s", measure.as_secs().max(1)))
        .arg(format!("--threads={}", ctx.mc.client_threads))
        .arg(format!("--concurrency={conc}"))
        // memcaslap takes the window only in thousands ("1k" at least).
        .arg(format!("--win_size={}k", (range / conc / 1000).max(1)))
        .arg(format!("--cfg_cmd={}", cfg.display()));
    let out = run_capture(
        c,
        "memcaslap",
        measure + Duration::from_secs(120),
        ctx.stop_flag(),
    )?;
    parse_memcaslap(&out)
}

/// memcaslap's TPS (its `Run time: ... TPS: N` line) and `get_misses`.
fn parse_memcaslap(out: &str) -> BenchResult<(f64, u64)> {
    let tps = out
        .lines()
        .rfind(|l| l.starts_with("Run time:"))
        .and_then(|l| l.split("TPS:").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("memcaslap printed no TPS: {out:?}"))?;
    let misses = out
        .lines()
        .find_map(|l| l.strip_prefix("get_misses:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Ok((tps, misses))
}

/// What the server_version column says.
fn server_version(srv: Srv, memcached: &str) -> String {
    match srv {
        Srv::Memcached => format!("memcached {memcached}"),
        Srv::Ember { .. } => format!("ember {}", env!("CARGO_PKG_VERSION")),
    }
}

/// Ember's durability modes as measured (from INFO).
fn ember_durability_note(labels: &[Option<Labels>], srvs: &[Srv]) -> String {
    let modes: Vec<String> = srvs
        .iter()
        .zip(labels)
        .filter(|(s, _)| **s != Srv::Memcached)
        .filter_map(|(_, l)| l.as_ref())
        .map(|l| format!("{} ({})", l.durability, l.strategy))
        .collect();
    format!("Ember durability {}; memcached volatile", modes.join(", "))
}

/// The warm-up and memory half (`--warmup`).
fn warmup(ctx: &mut Ctx) -> BenchResult<Report> {
    let sizes: &[u64] = if ctx.quick {
        &[5_000, 20_000]
    } else {
        &[1_000_000, 10_000_000]
    };
    let rounds = ctx.rounds(1);
    let msync = ctx.strategy == "msync";
    let (version, srvs) = servers(ctx, &[Srv::Ember { msync }])?;
    let with_ember = srvs.len() > 1;
    ctx.progress
        .plan((sizes.len() * rounds * srvs.len()) as u64);
    let mut table = Table::new(
        ctx,
        &[
            "items",
            "round",
            "value_size",
            "client_threads",
            "launch_ms",
            "populate_ms",
            "warm_ms",
            "restart_ms",
            "items_present",
            "server_items",
            "server_bytes",
            "server_bytes_per_item",
            "rss_bytes_per_item",
            "rss_bytes",
            "warm_ratio_memcached_over_ember",
            "server_version",
        ],
    );
    // (size, server) -> (warm ms, server bytes/item, rss bytes/item).
    let mut got: Vec<Vec<[Vec<f64>; 3]>> = vec![vec![Default::default(); srvs.len()]; sizes.len()];
    let mut labels: Vec<Option<Labels>> = vec![None; srvs.len()];
    let mut ember_missing = !with_ember;
    let threads = ctx.mc.client_threads;
    let stop = ctx.stop.clone();
    let stop = &*stop;
    let mut summary = Vec::new();
    for (zi, &items) in sizes.iter().enumerate() {
        for round in 1..=rounds {
            for (si, &srv) in srvs.iter().enumerate() {
                let what = format!("{items} items, round {round}");
                let tag = format!("warm-{items}-{round}");
                let Some(server) =
                    next_server(ctx, srv, items, &what, &tag, &version, &mut ember_missing)?
                else {
                    continue;
                };
                let rss0 = match (&server.mc, &server.ember) {
                    (Some(m), _) => m.rss(),
                    (_, Some(s)) => rss_of(s.pid()),
                    _ => 0,
                };
                // Ember's heap bytes in use before the fill (its used_memory
                // has a base that memcached's item `bytes` has not).
                let used0 = match &server.ember {
                    Some(s) => used_memory(s)?,
                    None => 0.0,
                };
                let known = Known::new(items);
                let (fill, perr) = mcload::populate(
                    server.port,
                    0..items,
                    VALUE_SIZE,
                    threads,
                    100,
                    &known,
                    stop,
                )
                .map_err(|e| format!("{}: populating: {e}", srv.label()))?;
                if perr.total() > 0 {
                    return Err(format!(
                        "{}: {} sets of {items} were not stored",
                        srv.label(),
                        perr.total()
                    ));
                }
                let fill_ms = fill.as_secs_f64() * 1e3;
                let lab = server.lab.clone();
                labels[si] = Some(lab.clone());
                let row = match (server.mc, server.ember) {
                    (Some(m), _) => {
                        let present = present(m.port, items, stop)?;
                        let stats = mcload::command(m.port, "stats", true)?;
                        let bytes = mcload::stat(&stats, "bytes").unwrap_or(0);
                        let curr = mcload::stat(&stats, "curr_items").unwrap_or(0);
                        let rss = m.rss();
                        let launch = server.launch.as_secs_f64() * 1e3;
                        drop(m);
                        WarmRow {
                            launch_ms: format!("{launch:.1}"),
                            fill_ms,
                            // Start to the first answer, then the fill.
                            warm_ms: launch + fill_ms,
                            restart_ms: None,
                            present,
                            server_keys: curr,
                            server_bytes: bytes,
                            server_bpi: bytes as f64 / curr.max(1) as f64,
                            rss_bpi: rss.saturating_sub(rss0) as f64 / items as f64,
                            rss,
                        }
                    }
                    (_, Some(s)) => {
                        let kind = srv.kind().expect("an Ember kind");
                        let used = used_memory(&s)?;
                        let keys = s
                            .conn(Duration::from_secs(60))?
                            .dbsize()
                            .map_err(|e| format!("DBSIZE: {e}"))?;
                        let rss = rss_of(s.pid());
                        let resp_port = s.port;
                        s.kill()?;
                        ctx.check_stop()?;
                        // The same data directory and ports, as a restart would.
                        let ember = ctx.ember()?;
                        let dir = server._dir.as_ref().expect("Ember's directory");
                        let mut spec =
                            server_spec(ctx, kind, dir.path(), &ember, ember_heap_mib(items));
                        let mc_port = server.port;
                        spec.extra = vec!["--memcached-port".into(), mc_port.to_string()];
                        let probe = items - 1;
                        let (s2, restart) = spec.start_until(
                            resp_port,
                            Duration::from_secs(600),
                            stop,
                            &mut |_| mcload::get_hits(mc_port, probe, VALUE_SIZE),
                        )?;
                        let present = present(mc_port, items, stop)?;
                        drop(s2);
                        WarmRow {
                            launch_ms: String::new(),
                            fill_ms,
                            warm_ms: restart.as_secs_f64() * 1e3,
                            restart_ms: Some(restart.as_secs_f64() * 1e3),
                            present,
                            server_keys: keys.max(0) as u64,
                            server_bytes: used as u64,
                            server_bpi: (used - used0).max(0.0) / items as f64,
                            rss_bpi: rss.saturating_sub(rss0) as f64 / items as f64,
                            rss,
                        }
                    }
                    _ => unreachable!("a server is memcached or Ember"),
                };
                if row.present != items {
                    return Err(format!(
                        "{}: {} of {items} items present after the {}",
                        srv.label(),
                        row.present,
                        if srv == Srv::Memcached {
                            "fill"
                        } else {
                            "restart"
                        }
                    ));
                }
                let ratio = match srv {
                    Srv::Memcached => String::new(),
                    _ => {
                        let mc = median(&got[zi][0][0]);
                        if mc.is_nan() {
                            String::new()
                        } else {
                            let r = mc / row.warm_ms;
                            if r < 10.0 {
                                format!("{r:.2}")
                            } else {
                                format!("{r:.0}")
                            }
                        }
                    }
                };
                table.push(
                    &lab,
                    vec![
                        items.to_string(),
                        round.to_string(),
                        VALUE_SIZE.to_string(),
                        threads.to_string(),
                        row.launch_ms.clone(),
                        format!("{:.1}", row.fill_ms),
                        format!("{:.1}", row.warm_ms),
                        row.restart_ms
                            .map(|r| format!("{r:.1}"))
                            .unwrap_or_default(),
                        row.present.to_string(),
                        row.server_keys.to_string(),
                        row.server_bytes.to_string(),
                        format!("{:.1}", row.server_bpi),
                        format!("{:.1}", row.rss_bpi),
                        row.rss.to_string(),
                        ratio.clone(),
                        server_version(srv, &version),
                    ],
                );
                got[zi][si][0].push(row.warm_ms);
                got[zi][si][1].push(row.server_bpi);
                got[zi][si][2].push(row.rss_bpi);
                let what = match srv {
                    Srv::Memcached => format!("repopulated in {:.0} ms", row.warm_ms),
                    _ => format!(
                        "restart after SIGKILL {:.1} ms (first fill {:.0} ms)",
                        row.warm_ms, row.fill_ms
                    ),
                };
                summary.push(format!(
                    "| {items:>9} | {:<11} | {:>10.1} | {:>9} | {:>8.1} | {:>8.1} |",
                    srv.label(),
                    row.warm_ms,
                    if ratio.is_empty() {
                        "-".into()
                    } else {
                        format!("{ratio}x")
                    },
                    row.server_bpi,
                    row.rss_bpi
                ));
                ctx.progress.done(&format!(
                    "{what}; {:.0} B/item (server), {:.0} B/item (RSS)",
                    row.server_bpi, row.rss_bpi
                ));
            }
        }
    }
    let ember_note = ember_durability_note(&labels, &srvs);
    println!(
        "\nlogfree-fig11 --warmup: memcached {version} repopulated from the client against ember serve restarted after SIGKILL\n\
         machine: {}\nmode: {} run, commit {}\nknobs: {threads} client thread(s) sharing the {} cores with the server, 100 pipelined sets a connection at a time, {VALUE_SIZE}-byte values\n{}\n\
         | items     | server      | warm ms    | mc/ember  | B/item   | RSS B/it |\n\
         |-----------|-------------|------------|-----------|----------|----------|\n{}",
        ctx.machine.line(),
        ctx.mode(),
        super::COMMIT,
        ctx.machine.cores,
        if ember_missing { NO_EMBER.to_string() } else { ember_note.clone() },
        summary.join("\n")
    );
    let series = |i: usize| -> Vec<Series> {
        srvs.iter()
            .enumerate()
            .filter(|(si, _)| labels[*si].is_some())
            .map(|(si, s)| {
                let name = match s {
                    Srv::Memcached => "memcached: start + repopulate".to_string(),
                    _ => format!("{}: restart after SIGKILL", s.label()),
                };
                let name = if i == 0 { name } else { s.label().to_string() };
                Series::new(
                    name,
                    sizes
                        .iter()
                        .zip(&got)
                        .filter(|(_, per)| !per[si][i].is_empty())
                        .map(|(&n, per)| (n as f64, median(&per[si][i])))
                        .collect(),
                )
            })
            .collect()
    };
    let groups: Vec<String> = sizes.iter().map(|n| format!("{n} items")).collect();
    let bpi = |title: &str, i: usize| {
        Panel::Bars(Bars {
            title: title.into(),
            y_label: "bytes per item".into(),
            groups: groups.clone(),
            series: srvs
                .iter()
                .enumerate()
                .filter(|(si, _)| labels[*si].is_some())
                .map(|(si, s)| {
                    (
                        s.label().to_string(),
                        got.iter()
                            .map(|per| (!per[si][i].is_empty()).then(|| median(&per[si][i])))
                            .collect(),
                    )
                })
                .collect(),
        })
    };
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "logfree-fig11 --warmup: memcached {version} repopulated against Ember's restart after SIGKILL (log-free Fig. 11)"
            ),
            subtitle: ctx.subtitle(&if ember_missing {
                "Ember not measured (no --memcached-port)".to_string()
            } else {
                ember_note
            }),
            panels: vec![
                Panel::Lines(Lines {
                    title: "time until every item is served".into(),
                    x_label: "items".into(),
                    y_label: "ms".into(),
                    x_log: true,
                    y_log: true,
                    series: series(0),
                    ..Lines::default()
                }),
                bpi("bytes per item (memcached stats bytes, Ember used_memory)", 1),
                bpi("RSS growth per item", 2),
            ],
        },
    })
}

/// How many of keys 0..items a server holds, each checked; an error for a
/// wrong value or reply.
fn present(port: u16, items: u64, stop: &std::sync::atomic::AtomicBool) -> BenchResult<u64> {
    let (hits, e) = mcload::verify_all(port, 0..items, VALUE_SIZE, 100, stop)?;
    if e.corrupt + e.unexpected > 0 {
        return Err(format!(
            "checking {items} items: {} wrong values, {} unexpected replies",
            e.corrupt, e.unexpected
        ));
    }
    Ok(hits)
}

/// Ember's INFO memory used_memory: the persistent heap's bytes in use.
fn used_memory(s: &Server) -> BenchResult<f64> {
    let mem = s
        .conn(Duration::from_secs(60))?
        .info("memory")
        .map_err(|e| format!("INFO memory: {e}"))?;
    super::resp::info_field(&mem, "used_memory")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no used_memory in INFO memory".to_string())
}

/// One server's warm-up measurement.
struct WarmRow {
    launch_ms: String,
    fill_ms: f64,
    warm_ms: f64,
    restart_ms: Option<f64>,
    present: u64,
    /// memcached's curr_items, Ember's DBSIZE.
    server_keys: u64,
    /// memcached's `stats` bytes, Ember's INFO used_memory (after the fill).
    server_bytes: u64,
    server_bpi: f64,
    rss_bpi: f64,
    rss: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcaslap_output_parses() {
        let out = "servers: 127.0.0.1:22122\nthreads count: 1\ncmd_get: 263218\ncmd_set: 29251\nget_misses: 7\n\nRun time: 3.0s Ops: 292469 TPS: 97483 Net_rate: 109.1M/s\n";
        assert_eq!(parse_memcaslap(out).unwrap(), (97483.0, 7));
        assert!(parse_memcaslap("key length must be greater than 16 bytes.").is_err());
    }

    #[test]
    fn rss_is_read() {
        assert!(rss_of(std::process::id()) > 0);
        assert_eq!(rss_of(u32::MAX), 0);
    }
}
