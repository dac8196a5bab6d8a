//! UDORN (database as image): Figures 4 and 5 against a real `redis-server`.
//!
//! Figure 4: each server is filled with N keys (pipelined SETs of 100-byte
//! values), then timed twice: SHUTDOWN to exit (Redis RDB: `SHUTDOWN SAVE`, the
//! snapshot is part of it; Redis AOF: `SHUTDOWN`, which flushes and fsyncs the
//! AOF; Ember: `SHUTDOWN`), and a new start on the same data to the first PONG
//! (Redis answers -LOADING until its data is loaded). DBSIZE after the launch
//! must be N.
//!
//! Figure 5: `redis-benchmark -t set,get,incr -d 100 -r 100000 -c 50` at -P 1
//! and -P 16 against Ember (pmem and msync durability) and Redis with AOF
//! (appendfsync everysec and always), servers in alternating order, a fresh
//! data directory each time; each server is killed after its benchmarks. With
//! the same options, UDORN's collection workloads (Fig. 5/6): `-t
//! lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,zpopmin,mset` with half the
//! requests of SET, and `-t lrange_100,lrange_300,lrange_600` with a twentieth
//! (each reply carries 100 to 600 values), on the same server after the string
//! tests.

use super::chart::{Bars, Chart, Lines, Panel, Series};
use super::child::{run_capture, TempDir};
use super::servers::{
    data_bytes, redis_benchmark, redis_version, BenchLine, BenchLoad, Kind, RedisMode, Server, Spec,
};
use super::table::{Labels, Table};
use super::{median, BenchResult, Ctx, Report};
use std::collections::BTreeMap;
use std::time::Duration;

pub(super) const VALUE_SIZE: usize = 100;

/// Heap size for an Ember holding `keys` keys of this scenario (MiB).
fn heap_mib(keys: u64) -> u64 {
    (keys.saturating_mul(600) >> 20)
        .saturating_add(256)
        .max(1024)
}

/// The labels of a server's rows (Ember's engine and strategy come from INFO).
pub(super) fn server_labels(ctx: &Ctx, kind: Kind, ember_info: Option<EmberInfo>) -> Labels {
    match kind {
        Kind::Ember { msync } => {
            let (engine, strategy, workers) = ember_info.unwrap_or_default();
            Labels {
                engine: "ember".into(),
                variant: engine,
                durability: if msync { "msync" } else { "pmem" }.into(),
                strategy,
                fence_ns: ctx.fence_ns,
                // `ember serve` has no node-read knob.
                read_ns: 0,
                threads: if workers > 0 {
                    workers
                } else {
                    ctx.machine.cores
                },
            }
        }
        Kind::Redis(_) => {
            let (durability, strategy) = kind.redis_labels();
            Labels {
                engine: "redis".into(),
                variant: kind.label().trim_start_matches("redis ").to_string(),
                durability: durability.into(),
                strategy: strategy.into(),
                fence_ns: 0,
                read_ns: 0,
                threads: 1,
            }
        }
    }
}

/// How to start `kind` in `dir` with the scenario's options (Ember: a new
/// heap of `heap_mib` MiB, sparse).
pub(super) fn server_spec<'a>(
    ctx: &Ctx,
    kind: Kind,
    dir: &'a std::path::Path,
    ember: &'a std::path::Path,
    heap_mib: u64,
) -> Spec<'a> {
    Spec {
        kind,
        dir,
        ember,
        fence_ns: ctx.fence_ns,
        heap_mib,
        extra: Vec::new(),
    }
}

/// The labels of a running server's rows (Ember's from its INFO).
pub(super) fn labels_of(ctx: &Ctx, kind: Kind, s: &Server) -> BenchResult<Labels> {
    let info = match kind {
        Kind::Ember { .. } => Some(ember_info(s)?),
        Kind::Redis(_) => None,
    };
    Ok(server_labels(ctx, kind, info))
}

/// What the server_version column says.
pub(super) fn server_version(kind: Kind, redis: &str) -> String {
    match kind {
        Kind::Ember { .. } => format!("ember {}", env!("CARGO_PKG_VERSION")),
        Kind::Redis(_) => format!("redis {redis}"),
    }
}

/// Ember's engine, persistence strategy and worker threads.
pub(super) type EmberInfo = (String, String, usize);

/// Ember's engine, persistence strategy and worker threads, from INFO.
pub(super) fn ember_info(s: &super::servers::Server) -> BenchResult<EmberInfo> {
    let mut c = s.conn(Duration::from_secs(30))?;
    let info = c.info("ember").map_err(|e| format!("INFO: {e}"))?;
    let engine = super::resp::info_field(&info, "engine")
        .unwrap_or("unknown")
        .to_string();
    let server = c.info("server").map_err(|e| format!("INFO: {e}"))?;
    let workers = super::resp::info_field(&server, "io_threads_active")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok((engine, s.ember_strategy()?, workers))
}

fn durability_note(ctx: &Ctx, ember: &str) -> String {
    if ctx.fence_ns == 0 {
        format!("Ember durability {ember}; Redis as labelled")
    } else {
        format!("Ember durability {ember}; Redis as labelled; the fence emulation applies to Ember only")
    }
}

pub fn fig4(ctx: &mut Ctx) -> BenchResult<Report> {
    let key_counts: &[u64] = if ctx.quick {
        &[1_000, 10_000, 50_000]
    } else {
        &[100_000, 1_000_000, 5_000_000]
    };
    let rounds = ctx.rounds(3);
    let msync = ctx.strategy == "msync";
    let kinds = [
        Kind::Ember { msync },
        Kind::Redis(RedisMode::Rdb),
        Kind::Redis(RedisMode::AofEverysec),
    ];
    let version = redis_version(ctx.stop_flag())?;
    ctx.progress
        .plan((key_counts.len() * rounds * kinds.len()) as u64);
    let mut table = Table::new(
        ctx,
        &[
            "keys",
            "round",
            "value_size",
            "shutdown_ms",
            "launch_ms",
            "dbsize_after",
            "data_bytes",
            "server_version",
        ],
    );
    // (kind, keys) -> measurements of every round.
    let mut shut: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); key_counts.len()]; kinds.len()];
    let mut launch = shut.clone();
    let mut ember_note = String::new();
    for (ki, &keys) in key_counts.iter().enumerate() {
        for round in 1..=rounds {
            for (si, &kind) in kinds.iter().enumerate() {
                ctx.progress
                    .start(format!("{}, {keys} keys, round {round}", kind.label()));
                let dir =
                    TempDir::new_in(ctx.work_dir(), &format!("{}-{keys}-{round}", kind.tag()))?;
                let ember = ctx.ember()?;
                let spec = server_spec(ctx, kind, dir.path(), &ember, heap_mib(keys));
                let c = launch_cycle(ctx, &spec, keys)?;
                let (s_ms, l_ms) = (c.shutdown_ms, c.launch_ms);
                let lab = server_labels(ctx, kind, c.ember);
                if matches!(kind, Kind::Ember { .. }) && ember_note.is_empty() {
                    ember_note = format!("{} ({})", lab.durability, lab.strategy);
                }
                table.push(
                    &lab,
                    vec![
                        keys.to_string(),
                        round.to_string(),
                        VALUE_SIZE.to_string(),
                        format!("{s_ms:.3}"),
                        format!("{l_ms:.3}"),
                        c.keys_after.to_string(),
                        c.data_bytes.to_string(),
                        server_version(kind, &version),
                    ],
                );
                shut[si][ki].push(s_ms);
                launch[si][ki].push(l_ms);
                ctx.progress
                    .done(&format!("shutdown {s_ms:.1} ms, launch {l_ms:.1} ms"));
            }
        }
    }
    let panel = |title: &str, data: &[Vec<Vec<f64>>]| {
        Panel::Lines(Lines {
            title: title.into(),
            x_label: "keys".into(),
            y_label: "time (ms)".into(),
            x_log: true,
            y_log: true,
            series: kinds
                .iter()
                .zip(data)
                .map(|(k, per_keys)| {
                    let pts = key_counts
                        .iter()
                        .zip(per_keys)
                        .map(|(&n, v)| (n as f64, median(v)))
                        .collect();
                    Series::new(k.label(), pts)
                })
                .collect(),
            ..Lines::default()
        })
    };
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "udorn-fig4: shutdown and launch time against keys, Ember against redis-server {version} (UDORN Fig. 4; median of {rounds})"
            ),
            subtitle: ctx.subtitle(&durability_note(ctx, &ember_note)),
            panels: vec![
                panel("shutdown: SHUTDOWN sent to process exit", &shut),
                panel("launch: start to first PONG (data loaded)", &launch),
            ],
        },
    })
}

/// What one launch cycle measured.
struct Cycle {
    shutdown_ms: f64,
    launch_ms: f64,
    /// DBSIZE after the launch.
    keys_after: i64,
    /// Bytes of the data directory after the shutdown.
    data_bytes: u64,
    /// Ember's engine and persistence strategy (INFO).
    ember: Option<EmberInfo>,
}

/// Start, fill with `keys` keys, timed shutdown, timed launch, check, stop.
fn launch_cycle(ctx: &Ctx, spec: &Spec<'_>, keys: u64) -> BenchResult<Cycle> {
    let stop = ctx.stop_flag();
    let start_timeout = Duration::from_secs(if ctx.quick { 30 } else { 600 });
    let io = Duration::from_secs(120);
    let label = spec.kind.label();
    let (s, _) = spec.start(start_timeout, stop)?;
    s.conn(io)?
        .load(keys, VALUE_SIZE, 1000)
        .map_err(|e| format!("{label}: loading {keys} keys: {e}"))?;
    let n = s
        .conn(io)?
        .dbsize()
        .map_err(|e| format!("{label}: DBSIZE: {e}"))?;
    if n != keys as i64 {
        return Err(format!("{label}: DBSIZE {n} after loading {keys} keys"));
    }
    let save: &[&str] = match spec.kind {
        Kind::Redis(RedisMode::Rdb) => &["SAVE"],
        _ => &[],
    };
    let shutdown = s.shutdown(save, start_timeout, stop)?;
    let bytes = data_bytes(spec.dir);
    ctx.check_stop()?;
    let (s, launch) = spec.start(start_timeout, stop)?;
    let after = s
        .conn(io)?
        .dbsize()
        .map_err(|e| format!("{label}: DBSIZE after the launch: {e}"))?;
    if after != keys as i64 {
        return Err(format!(
            "{label}: {after} keys after the launch, {keys} before the shutdown"
        ));
    }
    let info = match spec.kind {
        Kind::Ember { .. } => Some(ember_info(&s)?),
        Kind::Redis(_) => None,
    };
    let nosave: &[&str] = match spec.kind {
        Kind::Redis(_) => &["NOSAVE"],
        Kind::Ember { .. } => &[],
    };
    s.shutdown(nosave, start_timeout, stop)?;
    Ok(Cycle {
        shutdown_ms: shutdown.as_secs_f64() * 1e3,
        launch_ms: launch.as_secs_f64() * 1e3,
        keys_after: after,
        data_bytes: bytes,
        ember: info,
    })
}

/// The collection workloads of `udorn-fig5` (UDORN Fig. 5/6), MSET with them.
/// `redis-benchmark` runs them in its own order (pushes before pops).
const COLL_TESTS: &str = "lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,zpopmin,mset";
/// The LRANGE tests of `udorn-fig5` (`redis-benchmark` fills the list first,
/// a row named `LPUSH (needed to benchmark LRANGE)`).
const LRANGE_TESTS: &str = "lrange_100,lrange_300,lrange_600";

/// The servers of the `redis-benchmark` scenarios, in chart order: each Ember
/// mode beside the Redis mode it is compared with.
const LOAD_KINDS: [Kind; 4] = [
    Kind::Ember { msync: false },
    Kind::Redis(RedisMode::AofEverysec),
    Kind::Ember { msync: true },
    Kind::Redis(RedisMode::AofAlways),
];

/// The first columns of a `redis-benchmark` scenario's rows ([`load_cells`]).
pub(super) const LOAD_COLUMNS: [&str; 11] = [
    "test",
    "pipeline",
    "clients",
    "requests",
    "data_size",
    "keyspace",
    "round",
    "rps",
    "avg_latency_ms",
    "p50_latency_ms",
    "p99_latency_ms",
];

/// The cells of [`LOAD_COLUMNS`] for one test of one `redis-benchmark` run.
fn load_cells(l: &BenchLine, load: &BenchLoad, round: usize) -> Vec<String> {
    vec![
        l.test.clone(),
        load.pipeline.to_string(),
        load.clients.to_string(),
        load.requests.to_string(),
        load.data_size.to_string(),
        load.keyspace.to_string(),
        round.to_string(),
        l.rps.to_string(),
        l.avg_ms.clone(),
        l.p50_ms.clone(),
        l.p99_ms.clone(),
    ]
}

/// What a `redis-benchmark` scenario checks first: `redis-server`'s version
/// (returned) and that `redis-benchmark` runs, so that a missing tool is an
/// error before any server starts.
pub(super) fn load_preamble(ctx: &Ctx) -> BenchResult<String> {
    let version = redis_version(ctx.stop_flag())?;
    let mut probe = std::process::Command::new("redis-benchmark");
    probe.arg("--version");
    run_capture(
        probe,
        "redis-benchmark --version",
        Duration::from_secs(10),
        ctx.stop_flag(),
    )?;
    Ok(version)
}

/// One server of a `redis-benchmark` round, in a directory of its own. The
/// fields drop in order: the server is killed before its directory goes.
pub(super) struct LoadServer {
    pub s: Server,
    pub lab: Labels,
    _dir: TempDir,
}

/// Starts `kind` for round `round` of a `redis-benchmark` scenario (Ember with
/// a 1 GiB heap), with its progress line and row labels. Ember's durability
/// and strategy go into `ember_note` once (rounds repeat the same servers).
pub(super) fn start_for_load(
    ctx: &mut Ctx,
    kind: Kind,
    round: usize,
    ember_note: &mut Vec<String>,
) -> BenchResult<LoadServer> {
    ctx.progress
        .start(format!("{}, round {round}", kind.label()));
    let dir = TempDir::new_in(ctx.work_dir(), &format!("{}-{round}", kind.tag()))?;
    let ember = ctx.ember()?;
    let spec = server_spec(ctx, kind, dir.path(), &ember, 1024);
    let (s, _) = spec.start(Duration::from_secs(30), ctx.stop_flag())?;
    let lab = labels_of(ctx, kind, &s)?;
    if matches!(kind, Kind::Ember { .. }) {
        let note = format!("{} ({})", lab.durability, lab.strategy);
        if !ember_note.contains(&note) {
            ember_note.push(note);
        }
    }
    Ok(LoadServer { s, lab, _dir: dir })
}

/// One `redis-benchmark` invocation of `udorn-fig5` at each pipeline depth:
/// its tests and its requests at -P 1 (four times as many at -P 16).
struct Fig5Run {
    tests: &'static str,
    requests: u64,
}

/// The chart panels of `udorn-fig5` (one of each per pipeline depth): the
/// title and the tests in it, by [`short_test`] name.
const FIG5_PANELS: [(&str, &[&str]); 3] = [
    ("strings", &["SET", "GET", "INCR", "MSET"]),
    (
        "collections",
        &[
            "LPUSH", "RPUSH", "LPOP", "RPOP", "SADD", "HSET", "SPOP", "ZADD", "ZPOPMIN",
        ],
    ),
    ("list ranges", &["LRANGE_100", "LRANGE_300", "LRANGE_600"]),
];

/// A `redis-benchmark` test name without its explanation: `MSET (10 keys)` is
/// MSET, `LRANGE_100 (first 100 elements)` LRANGE_100. The list fill before
/// the LRANGE tests, `LPUSH (needed to benchmark LRANGE)`, keeps its name (it
/// is a row, not a bar).
fn short_test(test: &str) -> &str {
    if test.contains("needed to") {
        return test;
    }
    test.split(" (").next().unwrap_or(test)
}

pub fn fig5(ctx: &mut Ctx) -> BenchResult<Report> {
    let kinds = LOAD_KINDS;
    let pipelines = [1u32, 16];
    let rounds = ctx.rounds(3);
    // SET/GET/INCR as before; the collection workloads with half the requests
    // (each is a test of its own, thirteen of them), and the LRANGE tests,
    // whose replies are 100 to 600 values of 100 bytes, with a twentieth.
    let runs = if ctx.quick {
        [
            Fig5Run {
                tests: "set,get,incr",
                requests: 5_000,
            },
            Fig5Run {
                tests: COLL_TESTS,
                requests: 2_000,
            },
            Fig5Run {
                tests: LRANGE_TESTS,
                requests: 500,
            },
        ]
    } else {
        [
            Fig5Run {
                tests: "set,get,incr",
                requests: 200_000,
            },
            Fig5Run {
                tests: COLL_TESTS,
                requests: 100_000,
            },
            Fig5Run {
                tests: LRANGE_TESTS,
                requests: 10_000,
            },
        ]
    };
    let version = load_preamble(ctx)?;
    ctx.progress.plan((rounds * kinds.len()) as u64);
    let mut table = Table::new(ctx, &[&LOAD_COLUMNS[..], &["server_version"]].concat());
    // (pipeline, kind, short test name) -> rps of every round.
    let mut rps: Vec<Vec<BTreeMap<String, Vec<f64>>>> =
        vec![vec![BTreeMap::new(); kinds.len()]; pipelines.len()];
    let mut ember_note = Vec::new();
    let stop = ctx.stop.clone();
    let stop = &*stop;
    for round in 1..=rounds {
        for (si, &kind) in kinds.iter().enumerate() {
            let server = start_for_load(ctx, kind, round, &mut ember_note)?;
            let (s, lab) = (&server.s, &server.lab);
            let mut summary = Vec::new();
            for (pi, &p) in pipelines.iter().enumerate() {
                for run in &runs {
                    let load = BenchLoad {
                        tests: run.tests,
                        requests: if p == 1 {
                            run.requests
                        } else {
                            run.requests * 4
                        },
                        clients: 50,
                        pipeline: p,
                        data_size: VALUE_SIZE,
                        keyspace: 100_000,
                        command: &[],
                    };
                    let timeout = Duration::from_secs(if ctx.quick { 300 } else { 1800 });
                    let lines = redis_benchmark(s.port, &load, timeout, stop)?;
                    for l in &lines {
                        let mut cells = load_cells(l, &load, round);
                        cells.push(server_version(kind, &version));
                        table.push(lab, cells);
                        let t = short_test(&l.test);
                        rps[pi][si].entry(t.to_string()).or_default().push(l.rps);
                        if ["SET", "GET", "INCR", "LPUSH", "ZADD", "LRANGE_600"].contains(&t) {
                            summary.push(format!("{t} P{p} {:.0}k/s", l.rps / 1e3));
                        }
                    }
                }
            }
            // Killed, not shut down: nothing here depends on the stop, and its
            // data directory goes next (a clean close can take long: Ember in
            // msync mode spends seconds draining its logs).
            drop(server);
            ctx.progress.done(&summary.join(", "));
        }
    }
    let mut panels = Vec::new();
    for (title, tests) in FIG5_PANELS {
        for (p, per_kind) in pipelines.iter().zip(&rps) {
            panels.push(Panel::Bars(Bars {
                title: format!("{title}, -P {p} (pipeline depth), 50 clients"),
                y_label: "requests per second".into(),
                groups: tests.iter().map(|t| t.to_string()).collect(),
                series: kinds
                    .iter()
                    .zip(per_kind)
                    .map(|(k, per_test)| {
                        let vals = tests
                            .iter()
                            .map(|t| {
                                per_test
                                    .get(*t)
                                    .filter(|v| !v.is_empty())
                                    .map(|v| median(v))
                            })
                            .collect();
                        (k.label().to_string(), vals)
                    })
                    .collect(),
            }));
        }
    }
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "udorn-fig5: redis-benchmark -d {VALUE_SIZE} -r 100000, Ember against redis-server {version} with AOF (UDORN Fig. 5/6; median of {rounds})"
            ),
            subtitle: ctx.subtitle(&durability_note(ctx, &ember_note.join(", "))),
            panels,
        },
    })
}

/// Sustained writes: `SET -P 16` (50 clients, 100-byte values, 100,000 keys)
/// for 6,000,000 requests, long enough that Bullet's logs fill when its
/// gleaners apply more slowly than the clients write (under `msync`, where
/// every backend fence is a device flush). `udorn-fig5`'s 800,000 requests
/// end before that. Rows: throughput over the whole run, p99 and max latency,
/// and for Ember the times a writer found every log full (`log_full_waits`).
pub fn sustained(ctx: &mut Ctx) -> BenchResult<Report> {
    let kinds = LOAD_KINDS;
    let rounds = ctx.rounds(2);
    let requests = if ctx.quick { 20_000 } else { 6_000_000 };
    let version = load_preamble(ctx)?;
    ctx.progress.plan((rounds * kinds.len()) as u64);
    let mut table = Table::new(
        ctx,
        &[
            &LOAD_COLUMNS[..],
            &["max_latency_ms", "log_full_waits", "server_version"],
        ]
        .concat(),
    );
    // Per kind: (rps, p99, max) of every round.
    let mut got: Vec<[Vec<f64>; 3]> = vec![Default::default(); kinds.len()];
    let mut ember_note = Vec::new();
    let stop = ctx.stop.clone();
    let stop = &*stop;
    for round in 1..=rounds {
        for (si, &kind) in kinds.iter().enumerate() {
            let server = start_for_load(ctx, kind, round, &mut ember_note)?;
            let (s, lab) = (&server.s, &server.lab);
            let load = BenchLoad {
                tests: "set",
                requests,
                clients: 50,
                pipeline: 16,
                data_size: VALUE_SIZE,
                keyspace: 100_000,
                command: &[],
            };
            let timeout = Duration::from_secs(if ctx.quick { 120 } else { 1800 });
            let lines = redis_benchmark(s.port, &load, timeout, stop)?;
            let waits = match kind {
                Kind::Ember { .. } => {
                    let mut c = s.conn(Duration::from_secs(30))?;
                    let info = c.info("ember").map_err(|e| format!("INFO: {e}"))?;
                    super::resp::info_field(&info, "log_full_waits")
                        .unwrap_or("")
                        .to_string()
                }
                Kind::Redis(_) => String::new(),
            };
            let mut summary = Vec::new();
            for l in &lines {
                let mut cells = load_cells(l, &load, round);
                cells.extend([
                    l.max_ms.clone(),
                    waits.clone(),
                    server_version(kind, &version),
                ]);
                table.push(lab, cells);
                got[si][0].push(l.rps);
                if let Ok(v) = l.p99_ms.parse() {
                    got[si][1].push(v);
                }
                if let Ok(v) = l.max_ms.parse() {
                    got[si][2].push(v);
                }
                summary.push(format!(
                    "{} P16 {:.0}k/s, p99 {} ms, max {} ms",
                    l.test,
                    l.rps / 1e3,
                    l.p99_ms,
                    l.max_ms
                ));
            }
            // Killed, not shut down (as in udorn-fig5).
            drop(server);
            ctx.progress.done(&summary.join(", "));
        }
    }
    let panel = |i: usize, title: &str, y: &str| {
        Panel::Bars(Bars {
            title: title.into(),
            y_label: y.into(),
            groups: vec![format!("SET -P 16, {requests} requests")],
            series: kinds
                .iter()
                .zip(&got)
                .map(|(k, g)| {
                    let v = &g[i];
                    (
                        k.label().to_string(),
                        vec![(!v.is_empty()).then(|| median(v))],
                    )
                })
                .collect(),
        })
    };
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "udorn-sustained: redis-benchmark SET -P 16 -c 50 -d {VALUE_SIZE} -r 100000, Ember against redis-server {version} with AOF (median of {rounds})"
            ),
            subtitle: ctx.subtitle(&durability_note(ctx, &ember_note.join(", "))),
            panels: vec![
                panel(0, "throughput over the whole run", "requests per second"),
                panel(1, "p99 latency", "ms"),
                panel(2, "max latency", "ms"),
            ],
        },
    })
}
